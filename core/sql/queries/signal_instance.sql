-- Signal $1 with payload $2 to instance $3: woken now if it awaits (whatever
-- it awaits), else kept in its mailbox until it awaits $1, unless it is
-- finished. The row lock orders this with the handoff that moves the
-- instance to await, so the signal is woken with or found kept. Returns the
-- status the instance had and whether the signal was kept; no row for an
-- unknown instance.
WITH target AS (
    SELECT id, status FROM __S__.instances WHERE id = $3 FOR UPDATE
), woken AS (
    UPDATE __S__.instances i
    SET status = 'available', wake = jsonb_build_object('signal', $1::text, 'payload', $2::jsonb),
        await_signal = NULL, await_until = NULL, scheduled_at = now()
    FROM target t
    WHERE i.id = t.id AND t.status = 'awaiting'
    RETURNING i.queue
), kept AS (
    INSERT INTO __S__.mailbox (instance, name, payload)
    SELECT t.id, $1, $2 FROM target t
    WHERE t.status IN ('scheduled', 'available', 'executing')
    RETURNING id
), notified AS (
    SELECT pg_notify($4, queue) FROM woken
)
SELECT t.status, (SELECT count(*) FROM kept) > 0 AS kept, (SELECT count(*) FROM notified) AS notified
FROM target t
