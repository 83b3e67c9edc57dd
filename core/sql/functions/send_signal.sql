-- Wake every instance awaiting `signal` with `payload`; when none was woken
-- and `ttl` (seconds) is given, keep it for the first instance that awaits
-- it within that time (see handoff). Under the signal's lock, which a
-- handoff moving instances to await it also takes, so an instance that
-- starts awaiting it meanwhile is either woken here or finds it kept.
CREATE OR REPLACE FUNCTION send_signal(signal text, payload jsonb, ttl float8, channel text,
                                       OUT woken integer, OUT kept boolean)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    notified integer;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext(current_schema() || '.signal'), hashtext(signal));
    WITH w AS (
        UPDATE instances
        SET status = 'available', wake = jsonb_build_object('signal', signal, 'payload', payload),
            await_signal = NULL, await_until = NULL, scheduled_at = now()
        WHERE status = 'awaiting' AND await_signal = signal
        RETURNING queue
    ), n AS (
        SELECT pg_notify(channel, q) FROM (SELECT DISTINCT queue AS q FROM w) d
    )
    SELECT (SELECT count(*) FROM w), (SELECT count(*) FROM n) INTO woken, notified;
    kept := woken = 0 AND ttl IS NOT NULL;
    IF kept THEN
        INSERT INTO mailbox (instance, name, payload, expires_at)
        VALUES (NULL, signal, payload, now() + make_interval(secs => ttl));
    END IF;
END
$$;
