-- Many instances in one statement, from parallel arrays. Rows due now are
-- 'available' and wake the pickers of their queue (on commit, so an insert in
-- the caller's transaction wakes nobody until it commits).
WITH input AS (
    SELECT u.*, coalesce(u.at, now() + make_interval(secs => coalesce(u.delay, 0))) AS due
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::smallint[], $6::text[],
                $7::text[], $8::integer[], $9::float8[], $10::timestamptz[])
         WITH ORDINALITY AS u(workflow, step, state, queue, priority, ckey, rkey, max_attempts,
                              delay, at, ord)
), ins AS (
    INSERT INTO __S__.instances (workflow, step, state, queue, priority, concurrency_key, rate_key,
                                 max_attempts, status, scheduled_at)
    SELECT workflow, step, state::jsonb, queue, priority, ckey, rkey, max_attempts,
           CASE WHEN due > now() THEN 'scheduled' ELSE 'available' END, due
    FROM input
    ORDER BY ord
    RETURNING id, queue, status
), notified AS (
    SELECT pg_notify($11, q) FROM (SELECT DISTINCT queue AS q FROM ins WHERE status = 'available') d
)
SELECT id, (SELECT count(*) FROM notified) AS notified FROM ins ORDER BY id
