-- Rows of a workflow no live node runs leave the pick's index too.
--
-- A pick takes only the workflows its node runs, so it stepped over every
-- row of its queue of a workflow none of the queue's live nodes runs (a
-- misspelt name, a worker not deployed yet, one retired): a deep backlog of
-- such rows cost every pick of the queue. Such rows are now parked as
-- 'workflow':
-- * on insert, when some live node serves the row's queue and none of those
--   runs its workflow (with no live node for the queue nothing is parked:
--   the first node to come decides);
-- * by park_orphans, which every node runs each maintenance pass over the
--   head of each queue it serves (rows inserted before any node served the
--   queue, rows left runnable when the last node running their workflow
--   stopped);
-- and unparked by unpark_workflows, which every node runs each pass for the
-- queues and workflows it serves: a node that runs the workflow takes its
-- rows back within a pass of starting.

ALTER TABLE instances DROP CONSTRAINT instances_parked_check;
ALTER TABLE instances ADD CONSTRAINT instances_parked_check CHECK (parked IN ('key', 'rate', 'workflow'));

CREATE INDEX instances_parked_workflow ON instances (workflow, queue, priority, scheduled_at, id)
    WHERE status = 'available' AND parked = 'workflow';

-- Whether rows of `wf` in queue `q` wait for no live node: some node that
-- heartbeated within `lease` seconds serves the queue, and none of those runs
-- the workflow. A node that records no workflows may run any.
CREATE FUNCTION orphaned(q text, wf text, lease float8)
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
SET jit = off
AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM nodes n
                   WHERE n.heartbeat_at > now() - make_interval(secs => lease) AND n.queues ? q)
       AND NOT EXISTS (SELECT 1 FROM nodes n
                       WHERE n.heartbeat_at > now() - make_interval(secs => lease) AND n.queues ? q
                         AND coalesce(n.workflows ? wf, true));
END
$$;

-- Park the rows of a workflow no live node runs among the first `lim` rows
-- of queue `q` in pick order. Only the head matters: a pick stops as soon as
-- it has its rows, so rows deep in the queue cost nothing until they get
-- near the head. Returns the rows parked (`lim`: look again).
CREATE FUNCTION park_orphans(q text, lease float8, lim integer)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET jit = off
AS $$
DECLARE
    n integer;
BEGIN
    WITH head AS MATERIALIZED (
        SELECT i.id, i.workflow FROM instances i
        WHERE i.queue = q AND i.status = 'available' AND i.parked IS NULL AND i.node IS NULL
        ORDER BY i.priority, i.scheduled_at, i.id
        LIMIT lim
    ), workflows AS MATERIALIZED (
        -- Materialised: as a subquery, the planner pushes the orphaned() test
        -- below the DISTINCT and asks it once per row.
        SELECT DISTINCT workflow FROM head
    ), orphans AS MATERIALIZED (
        SELECT w.workflow FROM workflows w WHERE orphaned(q, w.workflow, lease)
    ), todo AS (
        -- Locked only once chosen; a row a pick holds is left to it. By
        -- primary key: with the status tests inside, a generic plan took the
        -- pick's index (whose predicate they match) and scanned it for the id.
        SELECT x.id
        FROM head h JOIN orphans o ON o.workflow = h.workflow
        CROSS JOIN LATERAL (SELECT y.id, y.status, y.parked, y.node FROM instances y
                            WHERE y.id = h.id
                            FOR UPDATE SKIP LOCKED) x
        WHERE x.status = 'available' AND x.parked IS NULL AND x.node IS NULL
    ), parked AS (
        UPDATE instances i SET parked = 'workflow' WHERE i.id = ANY (ARRAY(SELECT t.id FROM todo t)) RETURNING 1
    )
    SELECT count(*) INTO n FROM parked;
    RETURN n;
END
$$;

-- Unpark, in pick order, up to `lim` rows of each of `workflows` in each of
-- `queues` (the ones a node serves and runs) and wake their queues on
-- `channel`. Returns the rows unparked. Keyed rows among them that their key
-- has no room for are parked again by the first pick that meets them.
CREATE FUNCTION unpark_workflows(queues text[], workflows text[], lim integer, channel text)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET jit = off
AS $$
DECLARE
    n integer;
BEGIN
    WITH c AS (
        SELECT p.id FROM unnest(queues) AS q(name) CROSS JOIN unnest(workflows) AS w(name)
        CROSS JOIN LATERAL (
            SELECT i.id FROM instances i
            WHERE i.workflow = w.name AND i.queue = q.name AND i.status = 'available'
              AND i.parked = 'workflow'
            ORDER BY i.priority, i.scheduled_at, i.id
            LIMIT lim
            FOR UPDATE SKIP LOCKED) p
    ), u AS (
        UPDATE instances i SET parked = NULL WHERE i.id = ANY (ARRAY(SELECT c.id FROM c)) RETURNING i.queue
    ), woken AS (
        SELECT pg_notify(channel, d.queue) FROM (SELECT DISTINCT queue FROM u) d
    )
    SELECT (SELECT count(*) FROM u) + 0 * (SELECT count(*) FROM woken) INTO n;
    RETURN n;
END
$$;

-- reconcile_gates() as in 20261201000007, and: the counters follow the
-- configured limits (`gate_names`, `gate_limits`, `gate_shards`: the
-- caller's configuration, which every node must share). Counters minted
-- under another limit kept it while their key had steps running, which a key
-- with a backlog always has: a limit lowered or raised in the configuration
-- never took effect. Now a key whose shards are the configured ones gets the
-- configured limit spread over them as the pick mints it (steps running over
-- a lowered limit finish; none starts until the key is under it); a key with
-- another number of shards is deleted once idle, as before, and minted anew.
-- Keys whose free slots grew get their parked rows unparked into them, and
-- their queues woken on `channel`.
DROP FUNCTION reconcile_gates(text, integer);
CREATE FUNCTION reconcile_gates(after text, lim integer, gate_names text[], gate_limits integer[],
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
