-- Many instances in one statement, from parallel arrays. Rows due now are
-- 'available' and wake the pickers of their queue (on commit, so an insert in
-- the caller's transaction wakes nobody until it commits). Rows flagged in
-- $12 are claimed by the inserting node $13 as they are inserted (see
-- `Engine::insert_many`): they start there without a pick and wake nobody.
-- Rows due now of a key beyond the room it has (see key_room; $14/$15 the
-- gate names and limits) are parked: they wait for their key out of the
-- pick's index.
WITH input AS (
    SELECT u.*, coalesce(u.at, now() + make_interval(secs => coalesce(u.delay, 0))) AS due,
           u.ckey IS NOT NULL AND NOT u.here AND u.at IS NULL AND coalesce(u.delay, 0) <= 0 AS waits
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::smallint[], $6::text[],
                $7::text[], $8::integer[], $9::float8[], $10::timestamptz[], $12::boolean[])
         WITH ORDINALITY AS u(workflow, step, state, queue, priority, ckey, rkey, max_attempts,
                              delay, at, here, ord)
), room AS (
    SELECT * FROM __S__.key_room((SELECT array_agg(ckey) FROM input WHERE waits), $14, $15)
), ranked AS (
    SELECT input.*, row_number() OVER (PARTITION BY ckey, waits ORDER BY priority, ord) AS krank
    FROM input
), ins AS (
    INSERT INTO __S__.instances (workflow, step, state, queue, priority, concurrency_key, rate_key,
                                 max_attempts, status, scheduled_at, node, attempt, attempted_at, token,
                                 parked)
    SELECT r.workflow, r.step, r.state::jsonb, r.queue, r.priority, r.ckey, r.rkey, r.max_attempts,
           CASE WHEN r.here THEN 'executing' WHEN r.due > now() THEN 'scheduled' ELSE 'available' END,
           r.due,
           CASE WHEN r.here THEN $13 END,
           CASE WHEN r.here THEN 1 ELSE 0 END,
           CASE WHEN r.here THEN now() END,
           CASE WHEN r.here THEN 1 ELSE 0 END,
           CASE WHEN r.waits AND r.krank > coalesce((SELECT room FROM room WHERE room.key = r.ckey), 0)
                THEN 'key' END
    FROM ranked r
    ORDER BY r.ord
    RETURNING id, queue, status, CASE WHEN status = 'executing' THEN state END AS state
), notified AS (
    SELECT pg_notify($11, q) FROM (SELECT DISTINCT queue AS q FROM ins WHERE status = 'available') d
)
SELECT id, state, (SELECT count(*) FROM notified) AS notified FROM ins ORDER BY id
