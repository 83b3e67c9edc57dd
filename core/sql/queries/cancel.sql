-- Cancel the instances filter $1..$6 names, up to $8 after id $7 (see
-- matching). Not yet started: cancelled now. Executing, or reserved by a
-- node as a successor (it may already run): flagged, its outcome records it
-- as cancelled, and the nodes are told on channel $10 (on commit), so that
-- the one running it stops the step. $9: the reason recorded. Returns each
-- instance named with the status it had, in id order.
WITH prev AS (
    SELECT id, status, errors, (status = 'executing' OR (status = 'available' AND node IS NOT NULL)) AS held
    FROM __S__.instances
    WHERE id IN (SELECT __S__.matching($1, $2, $3, $4, $5, $6, $7, $8))
    FOR UPDATE
), upd AS (
    UPDATE __S__.instances i SET
        status = CASE WHEN p.held THEN p.status ELSE 'cancelled' END,
        cancel_requested = p.held,
        finished_at = CASE WHEN p.held THEN NULL ELSE now() END,
        errors = p.errors || jsonb_build_array(jsonb_build_object(
            'kind', 'cancel', 'message', $9::text, 'at', now())),
        await_signal = NULL, await_until = NULL
    FROM prev p
    WHERE i.id = p.id AND p.status NOT IN ('completed', 'cancelled', 'discarded')
    RETURNING i.id
), told AS (
    SELECT pg_notify($10, p.id::text) FROM prev p
    WHERE p.held AND p.status NOT IN ('completed', 'cancelled', 'discarded')
)
SELECT p.id, p.status, (SELECT count(*) FROM told) AS told, (SELECT count(*) FROM upd) AS changed
FROM prev p ORDER BY p.id
