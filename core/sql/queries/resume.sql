-- Resume queue $1 and wake its pickers on channel $2; returns whether it was
-- paused.
WITH r AS (
    DELETE FROM __S__.queue_pauses WHERE queue = $1 RETURNING queue
), woken AS (
    SELECT pg_notify($2, queue) FROM r
)
SELECT count(*) > 0, (SELECT count(*) FROM woken) FROM r
