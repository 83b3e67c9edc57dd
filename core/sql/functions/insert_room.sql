-- The room each key has for the rows an insert adds to wait unparked: its
-- key_room, and at least one row for a key with no row waiting at all
-- (parked, unparked or reserved). An insert parks the rows beyond it.
--
-- A row parked because its key is executing waits for the call that frees
-- the key to hand the key over or unpark it; but a call freeing the key while
-- the insert is not yet committed sees neither that row nor any other of the
-- key, and leaves the key free with the row parked until the maintenance
-- sweep. An insert cannot lock the key's holder to order the two as the pick
-- does: it runs in the caller's transaction, which may last, and the outcome
-- call would wait for it. So the key's first new row waits unparked: the
-- call freeing the key meanwhile leaves it to the next pick, and a pick that
-- finds the key still held parks it (pick.sql). A key with rows already
-- waiting gets none: the call that frees it takes the oldest of those.
-- Each lookup says the condition of one index only (the heads', the parked
-- rows') and is a lateral probe: as `NOT EXISTS`, planned while the table
-- was small, it became one hashed scan of the whole table per call (146 ms an
-- insert call while W5's backlogs went in).
CREATE OR REPLACE FUNCTION insert_room(keys text[], gate_names text[], gate_limits integer[])
RETURNS TABLE (key text, room integer)
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT r.key, CASE WHEN r.room = 0 AND w.id IS NULL THEN 1 ELSE r.room END
    FROM key_room(keys, gate_names, gate_limits) r
    LEFT JOIN LATERAL (
        (SELECT a.id FROM instances a
         WHERE a.concurrency_key = r.key AND coalesce(a.parked, a.status) = 'available'
         LIMIT 1)
        UNION ALL
        (SELECT a.id FROM instances a
         WHERE a.concurrency_key = r.key AND a.status = 'available' AND a.parked = 'key'
         LIMIT 1)
        LIMIT 1) w ON true;
END
$$;
