-- The key sweep: up to `lim` keys with parked rows from the first after
-- `after` (NULL: from the start), each unparked as far as it has room; their
-- queues woken on `channel`. Catches what races, the reaper and the gate
-- reconciler leave parked with room free. Returns the rows unparked and the
-- last key swept (NULL once the sweep reached the end). Rate-limited rows
-- have a sweep of their own (rate_sweep).
CREATE OR REPLACE FUNCTION unpark_sweep(after text, lim integer, channel text,
                                        gate_names text[], gate_limits integer[],
                                        OUT unparked integer, OUT last_key text)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET jit = off
AS $$
DECLARE
    ks text[];
BEGIN
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
END
$$;
