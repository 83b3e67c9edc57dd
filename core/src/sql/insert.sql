-- Many instances in one statement, from parallel arrays. Rows due now are
-- 'available' and wake the pickers of their queue (on commit, so an insert in
-- the caller's transaction wakes nobody until it commits). Rows flagged in
-- $12 are claimed by the inserting node $13 as they are inserted (see
-- `Engine::insert_many`): they start there without a pick and wake nobody.
WITH input AS (
    SELECT u.*, coalesce(u.at, now() + make_interval(secs => coalesce(u.delay, 0))) AS due
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::smallint[], $6::text[],
                $7::text[], $8::integer[], $9::float8[], $10::timestamptz[], $12::boolean[])
         WITH ORDINALITY AS u(workflow, step, state, queue, priority, ckey, rkey, max_attempts,
                              delay, at, here, ord)
), ins AS (
    INSERT INTO __S__.instances (workflow, step, state, queue, priority, concurrency_key, rate_key,
                                 max_attempts, status, scheduled_at, node, attempt, attempted_at, token)
    SELECT workflow, step, state::jsonb, queue, priority, ckey, rkey, max_attempts,
           CASE WHEN here THEN 'executing' WHEN due > now() THEN 'scheduled' ELSE 'available' END,
           due,
           CASE WHEN here THEN $13 END,
           CASE WHEN here THEN 1 ELSE 0 END,
           CASE WHEN here THEN now() END,
           CASE WHEN here THEN 1 ELSE 0 END
    FROM input
    ORDER BY ord
    RETURNING id, queue, status, CASE WHEN status = 'executing' THEN state END AS state
), notified AS (
    SELECT pg_notify($11, q) FROM (SELECT DISTINCT queue AS q FROM ins WHERE status = 'available') d
)
SELECT id, state, (SELECT count(*) FROM notified) AS notified FROM ins ORDER BY id
