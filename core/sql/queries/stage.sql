-- Make due scheduled rows runnable and wake timed-out awaits; wake the queues.
WITH due AS (
    SELECT id FROM __S__.instances
    WHERE status = 'scheduled' AND scheduled_at <= now()
    ORDER BY scheduled_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), staged AS (
    UPDATE __S__.instances i SET status = 'available'
    FROM due WHERE i.id = due.id
    RETURNING i.queue
), expired AS (
    SELECT id FROM __S__.instances
    WHERE status = 'awaiting' AND await_until <= now()
    ORDER BY await_until
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), woken AS (
    UPDATE __S__.instances i
    SET status = 'available', wake = '{"timeout": true}', await_signal = NULL, await_until = NULL,
        scheduled_at = now()
    FROM expired WHERE i.id = expired.id
    RETURNING i.queue
), queues AS (
    SELECT DISTINCT queue FROM (SELECT queue FROM staged UNION ALL SELECT queue FROM woken) q
)
SELECT (SELECT count(*) FROM staged) + (SELECT count(*) FROM woken) AS moved,
       (SELECT count(*) FROM (SELECT pg_notify($2, queue) FROM queues) n) AS notified
