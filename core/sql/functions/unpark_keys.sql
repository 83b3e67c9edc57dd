-- Unpark the next rows of `keys`, in key order, as far as each key has room,
-- and wake their queues on `channel` (NULL: the caller wakes them). Returns
-- how many rows it unparked.
CREATE OR REPLACE FUNCTION unpark_keys(keys text[], gate_names text[], gate_limits integer[], channel text)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET jit = off
AS $$
DECLARE
    n integer;
BEGIN
    WITH r AS (
        SELECT key, room FROM key_room(keys, gate_names, gate_limits) WHERE room > 0
    ), c AS (
        SELECT p.id FROM r CROSS JOIN LATERAL (
            SELECT i.id FROM instances i
            WHERE i.concurrency_key = r.key AND i.status = 'available' AND i.parked = 'key'
            ORDER BY i.priority, i.scheduled_at, i.id
            LIMIT r.room
            FOR UPDATE SKIP LOCKED) p
    ), u AS (
        UPDATE instances i SET parked = NULL WHERE i.id = ANY (ARRAY(SELECT c.id FROM c)) RETURNING i.queue
    ), woken AS (
        SELECT pg_notify(channel, q) FROM (SELECT DISTINCT queue AS q FROM u) d WHERE channel IS NOT NULL
    )
    SELECT ((SELECT count(*) FROM u) + 0 * (SELECT count(*) FROM woken))::integer INTO n;
    RETURN n;
END
$$;
