-- A drain's `scheduled` option: every scheduled row of queue $1 runnable
-- now, whatever its time. Returns how many.
WITH moved AS (
    UPDATE __S__.instances SET status = 'available', scheduled_at = now()
    WHERE queue = $1 AND status = 'scheduled'
    RETURNING 1
)
SELECT count(*) FROM moved
