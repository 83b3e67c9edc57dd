-- The sweep: if `keys`, up to `lim` keys with parked rows from the first
-- after `after` (NULL: from the start), each unparked as far as it has room;
-- then up to `lim` rate-limit keys with parked rows, each unparked as far as
-- its limit allows starts now (a name no longer configured: all of them,
-- `lim` at a time). Queues with rows unparked are woken on `channel`. Returns the rows
-- unparked and the last key swept (NULL once the sweep reached the end).
CREATE OR REPLACE FUNCTION unpark_sweep(after text, lim integer, keys boolean, channel text,
                             gate_names text[], gate_limits integer[],
                             rate_names text[], rate_intervals float8[], rate_tolerances float8[],
                             OUT unparked integer, OUT last_key text)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET jit = off
AS $$
DECLARE
    ks text[];
    n_rate integer;
BEGIN
    unparked := 0;
    IF keys THEN
        -- Distinct keys with parked rows, one index probe each.
        WITH RECURSIVE k AS (
            (SELECT i.concurrency_key AS key FROM instances i
             WHERE i.status = 'available' AND i.parked = 'key' AND i.concurrency_key > coalesce(after, '')
             ORDER BY i.concurrency_key LIMIT 1)
            UNION ALL
            SELECT (SELECT i.concurrency_key FROM instances i
                    WHERE i.status = 'available' AND i.parked = 'key' AND i.concurrency_key > k.key
                    ORDER BY i.concurrency_key LIMIT 1)
            FROM k WHERE k.key IS NOT NULL
        )
        SELECT array_agg(key) INTO ks FROM (SELECT key FROM k WHERE key IS NOT NULL LIMIT lim) x;
        unparked := coalesce(unpark_keys(ks, gate_names, gate_limits, channel), 0);
        last_key := CASE WHEN cardinality(ks) >= lim THEN ks[cardinality(ks)] END;
    END IF;

    -- Rate-limited rows, from the first key each time: the rate waker
    -- sweeps them too, when their limits allow.
    SELECT r.unparked INTO n_rate
    FROM rate_sweep(NULL, lim, channel, rate_names, rate_intervals, rate_tolerances) r;
    unparked := unparked + n_rate;
END
$$;
