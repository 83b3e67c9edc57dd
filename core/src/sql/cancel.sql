-- Cancel one instance. Not yet executing: cancelled now. Executing: flagged,
-- and its outcome records it as cancelled. Returns the previous status, or no
-- row when the instance is unknown.
WITH prev AS (
    SELECT id, status, errors FROM __S__.instances WHERE id = $1 FOR UPDATE
), upd AS (
    UPDATE __S__.instances i SET
        status = CASE WHEN p.status = 'executing' THEN 'executing' ELSE 'cancelled' END,
        cancel_requested = (p.status = 'executing'),
        finished_at = CASE WHEN p.status = 'executing' THEN NULL ELSE now() END,
        errors = p.errors || jsonb_build_array(jsonb_build_object(
            'kind', 'cancel', 'message', $2::text, 'at', now())),
        await_signal = NULL, await_until = NULL
    FROM prev p
    WHERE i.id = p.id AND p.status NOT IN ('completed', 'cancelled', 'discarded')
    RETURNING i.id
)
SELECT status FROM prev
