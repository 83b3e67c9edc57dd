-- The room each key has for rows to wait unparked: its K (a gate's limit,
-- from the caller's configuration; 1 otherwise) minus its executing rows and
-- the rows already waiting unparked. Counts stop at K, so a key with many
-- unparked rows costs no more than one with K.
-- Heads are looked up as coalesce(parked, status) = 'available', the
-- condition of their own index only (migration 20261205000000_heads).
CREATE OR REPLACE FUNCTION key_room(keys text[], gate_names text[], gate_limits integer[])
RETURNS TABLE (key text, room integer)
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT k.key, greatest(k.cap
               - (SELECT count(*) FROM (SELECT 1 FROM instances e
                                         WHERE e.status = 'executing' AND e.gate_shard IS NULL
                                           AND e.concurrency_key = k.key LIMIT k.cap) x)
               - (SELECT count(*) FROM (SELECT 1 FROM instances e
                                         WHERE e.status = 'executing' AND e.gate_shard IS NOT NULL
                                           AND e.concurrency_key = k.key LIMIT k.cap) x)
               - (SELECT count(*) FROM (SELECT 1 FROM instances a
                                         WHERE a.concurrency_key = k.key
                                           AND coalesce(a.parked, a.status) = 'available'
                                         LIMIT k.cap) x), 0)::integer
    FROM (SELECT d.key, coalesce(gate_limits[array_position(gate_names, split_part(d.key, ':', 1))], 1) AS cap
          FROM (SELECT DISTINCT unnest(keys) AS key) d) k;
END
$$;
