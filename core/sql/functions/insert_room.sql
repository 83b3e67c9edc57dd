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
CREATE OR REPLACE FUNCTION insert_room(keys text[], gate_names text[], gate_limits integer[])
RETURNS TABLE (key text, room integer)
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT r.key,
           CASE WHEN r.room = 0
                     AND NOT EXISTS (SELECT 1 FROM instances a
                                     WHERE a.concurrency_key = r.key AND a.status = 'available')
                THEN 1 ELSE r.room END
    FROM key_room(keys, gate_names, gate_limits) r;
END
$$;
