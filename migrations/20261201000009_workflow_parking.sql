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
    ), orphans AS MATERIALIZED (
        SELECT d.workflow FROM (SELECT DISTINCT workflow FROM head) d
        WHERE orphaned(q, d.workflow, lease)
    ), todo AS (
        -- Locked only once chosen; a row a pick holds is left to it.
        SELECT x.id
        FROM head h JOIN orphans o ON o.workflow = h.workflow
        CROSS JOIN LATERAL (SELECT y.id FROM instances y
                            WHERE y.id = h.id AND y.status = 'available' AND y.parked IS NULL
                              AND y.node IS NULL
                            FOR UPDATE SKIP LOCKED) x
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
