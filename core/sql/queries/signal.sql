-- Wake awaiting instances: every one awaiting signal $1, or only instance $3
-- (when not NULL) whatever it awaits. The woken step sees the payload.
WITH woken AS (
    UPDATE __S__.instances
    SET status = 'available', wake = jsonb_build_object('signal', $1::text, 'payload', $2::jsonb),
        await_signal = NULL, await_until = NULL, scheduled_at = now()
    WHERE status = 'awaiting'
      AND CASE WHEN $3::bigint IS NULL THEN await_signal = $1 ELSE id = $3 END
    RETURNING queue
), notified AS (
    SELECT pg_notify($4, q) FROM (SELECT DISTINCT queue AS q FROM woken) d
)
SELECT (SELECT count(*) FROM woken) AS woken, (SELECT count(*) FROM notified) AS notified
