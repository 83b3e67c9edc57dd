-- Many instances in one statement, from parallel arrays. Rows due now are
-- 'available' and wake the pickers of their queue (on commit, so an insert in
-- the caller's transaction wakes nobody until it commits). Rows flagged in
-- $12 are claimed by the inserting node $13 as they are inserted (see
-- `Engine::insert_many`): they start there without a pick and wake nobody.
-- Rows due now are parked (they wait out of the pick's index): those of a
-- workflow none of their queue's live nodes runs (`orphaned`, nodes live
-- within $19 seconds); else those beyond the room their key has (key_room,
-- with the gate names and limits $14/$15); else those beyond the room their
-- rate limit has (rate_room, with the rate limits $16/$17/$18).
WITH given AS (
    SELECT u.*, coalesce(u.at, now() + make_interval(secs => coalesce(u.delay, 0))) AS due,
           NOT u.here AND u.at IS NULL AND coalesce(u.delay, 0) <= 0 AS due_now
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::smallint[], $6::text[],
                $7::text[], $8::integer[], $9::float8[], $10::timestamptz[], $12::boolean[])
         WITH ORDINALITY AS u(workflow, step, state, queue, priority, ckey, rkey, max_attempts,
                              delay, at, here, ord)
), pairs AS MATERIALIZED (
    -- Materialised: as a subquery, the planner pushes the orphaned() test
    -- below the DISTINCT and asks it once per row.
    SELECT DISTINCT queue, workflow FROM given WHERE due_now
), orphans AS (
    SELECT p.queue, p.workflow FROM pairs p WHERE __S__.orphaned(p.queue, p.workflow, $19)
), input AS (
    -- now_due: due now and waiting for the pick (not parked for its workflow).
    SELECT g.*, o.queue IS NOT NULL AS orphan, g.due_now AND o.queue IS NULL AS now_due
    FROM given g LEFT JOIN orphans o ON o.queue = g.queue AND o.workflow = g.workflow AND g.due_now
), kroom AS (
    SELECT * FROM __S__.key_room(
        (SELECT array_agg(ckey) FROM input WHERE now_due AND ckey IS NOT NULL), $14, $15)
), kranked AS (
    SELECT i.*, i.now_due AND i.ckey IS NOT NULL
                AND row_number() OVER (PARTITION BY i.ckey, i.now_due ORDER BY i.priority, i.ord)
                    > coalesce((SELECT room FROM kroom WHERE kroom.key = i.ckey), 0) AS kpark
    FROM input i
), rroom AS (
    SELECT * FROM __S__.rate_room(
        (SELECT array_agg(rkey) FROM kranked WHERE now_due AND rkey IS NOT NULL AND NOT kpark),
        (SELECT count(*)::integer FROM input), $16, $17, $18)
), ranked AS (
    SELECT k.*, CASE WHEN k.orphan THEN 'workflow'
                     WHEN k.kpark THEN 'key'
                     WHEN k.now_due AND k.rkey IS NOT NULL
                          AND row_number() OVER (PARTITION BY k.rkey, k.now_due AND NOT k.kpark
                                                 ORDER BY k.priority, k.ord)
                              > coalesce((SELECT room FROM rroom WHERE rroom.key = k.rkey), 0)
                     THEN 'rate'
                END AS parked
    FROM kranked k
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
           r.parked
    FROM ranked r
    ORDER BY r.ord
    RETURNING id, queue, status, CASE WHEN status = 'executing' THEN state END AS state
), notified AS (
    SELECT pg_notify($11, q) FROM (SELECT DISTINCT queue AS q FROM ins WHERE status = 'available') d
)
SELECT id, state, (SELECT count(*) FROM notified) AS notified FROM ins ORDER BY id
