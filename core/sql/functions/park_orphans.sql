-- Park the rows of a workflow no live node runs among the first `lim` rows
-- of queue `q` in pick order. Only the head matters: a pick stops as soon as
-- it has its rows, so rows deep in the queue cost nothing until they get
-- near the head. Returns the rows parked (`lim`: look again).
CREATE OR REPLACE FUNCTION park_orphans(q text, lease float8, lim integer)
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
