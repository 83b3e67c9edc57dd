-- The gate reconciler, bounded: at most `lim` counters per sweep, from the
-- first key after `after` (NULL: from the start), so a sweep over many keys
-- never holds a connection long. Returns the counters changed and the last
-- key swept (NULL once it reached the end: the next sweep starts over).
--
-- Locks what it can (SKIP LOCKED: a busy shard is repaired next sweep), then
-- counts the executing rows with a fresh snapshot taken after the locks, so a
-- claim or outcome that committed before is always seen and a counter is
-- never set above the truth. Only locked shards are touched.
--
-- The counters follow the configured limits (`gate_names`, `gate_limits`,
-- `gate_shards`: the caller's configuration, which every node must share): a
-- key whose shards are the configured ones gets the configured limit spread
-- over them (steps running over a lowered limit finish; none starts until the
-- key is under it); a key with another number of shards is deleted once idle
-- and minted anew by the next pick. Keys whose free slots grew get their
-- parked rows unparked into them, and their queues woken on `channel`.
CREATE OR REPLACE FUNCTION reconcile_gates(after text, lim integer, gate_names text[], gate_limits integer[],
                                gate_shards integer[], channel text,
                                OUT changed integer, OUT last_key text)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET jit = off
AS $$
DECLARE
    lk text[];
    ls integer[];
    n_seen integer;
    grown text[];
BEGIN
    -- Whole keys only: a key's shards are swept together.
    WITH k AS (
        SELECT DISTINCT key FROM gate_slots
        WHERE after IS NULL OR key > after
        ORDER BY key
        LIMIT lim
    ), l AS (
        SELECT g.key, g.shard FROM gate_slots g
        WHERE g.key IN (SELECT key FROM k)
        ORDER BY g.key, g.shard
        FOR UPDATE SKIP LOCKED
    )
    SELECT array_agg(l.key), array_agg(l.shard), (SELECT count(*) FROM k), (SELECT max(key) FROM k)
    INTO lk, ls, n_seen, last_key FROM l;
    IF n_seen < lim THEN
        last_key := NULL;
    END IF;
    changed := 0;
    IF lk IS NULL THEN
        RETURN;
    END IF;

    -- A new statement: a fresh snapshot, taken after the locks.
    WITH mine AS (
        SELECT * FROM unnest(lk, ls) AS m(key, shard)
    ), cfg AS (
        -- The configured limit and shard count of each configured key, and
        -- the shards it has.
        SELECT c.key, gate_limits[c.gi] AS limit_, least(gate_shards[c.gi], gate_limits[c.gi]) AS shards,
               (SELECT count(*) FROM gate_slots g WHERE g.key = c.key) AS have
        FROM (SELECT DISTINCT m.key, array_position(gate_names, split_part(m.key, ':', 1)) AS gi
              FROM mine m) c
        WHERE c.gi IS NOT NULL
    ), truth AS (
        SELECT g.key, g.shard, g.available AS was,
               CASE WHEN c.key IS NOT NULL AND c.have = c.shards
                    THEN (c.limit_ / c.shards + CASE WHEN g.shard < c.limit_ % c.shards THEN 1 ELSE 0 END)
                    ELSE g.capacity
               END AS capacity,
               (SELECT count(*) FROM instances i
                WHERE i.status = 'executing' AND i.concurrency_key = g.key AND i.gate_shard = g.shard)::integer
                   AS executing
        FROM gate_slots g JOIN mine USING (key, shard) LEFT JOIN cfg c ON c.key = g.key
    ), idle AS (
        SELECT g.key FROM gate_slots g LEFT JOIN truth t USING (key, shard)
        WHERE g.key IN (SELECT key FROM mine)
        GROUP BY g.key
        HAVING bool_and(t.executing IS NOT NULL AND t.executing = 0)
    ), del AS (
        DELETE FROM gate_slots g USING idle WHERE g.key = idle.key RETURNING g.key
    ), fix AS (
        UPDATE gate_slots g SET capacity = t.capacity, available = greatest(t.capacity - t.executing, 0)
        FROM truth t
        WHERE g.key = t.key AND g.shard = t.shard
          AND (g.available <> greatest(t.capacity - t.executing, 0) OR g.capacity <> t.capacity)
          AND t.key NOT IN (SELECT key FROM idle)
        RETURNING g.key, greatest(t.capacity - t.executing, 0) > t.was AS grew
    )
    SELECT (SELECT count(*) FROM del) + (SELECT count(*) FROM fix),
           ARRAY(SELECT key FROM del UNION SELECT key FROM fix WHERE grew)
    INTO changed, grown;
    IF cardinality(grown) > 0 THEN
        PERFORM unpark_keys(grown, gate_names, gate_limits, channel);
    END IF;
END
$$;
