-- Unpark, in pick order, up to `lim` rows of each of `workflows` in each of
-- `queues` (the ones a node serves and runs) and wake their queues on
-- `channel`. Returns the rows unparked. Keyed rows among them that their key
-- has no room for are parked again by the first pick that meets them.
CREATE OR REPLACE FUNCTION unpark_workflows(queues text[], workflows text[], lim integer, channel text)
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
