-- Give reserved rows back to everyone: rows of `ids` reserved by `node_id`
-- under the matching `tokens` (a reservation given back late leaves a newer
-- one alone), or all of the node's when `ids` is NULL. A cancel that arrived
-- meanwhile takes effect. Returns how many rows it released.
--
-- All of a node's (`ids` NULL: it ended, or was presumed dead) are marked
-- cautious: any of them may have been started there as a successor and
-- ended the process before its promotion counted the attempt.
CREATE OR REPLACE FUNCTION release_reserved(node_id text, ids bigint[], tokens bigint[]) RETURNS integer
LANGUAGE sql VOLATILE
SET search_path FROM CURRENT
SET jit = off
AS $$
    WITH r AS (
        UPDATE instances i SET
            node = NULL,
            status = CASE WHEN i.cancel_requested THEN 'cancelled' ELSE 'available' END,
            finished_at = CASE WHEN i.cancel_requested THEN now() END,
            cautious = i.cautious OR ids IS NULL
        WHERE i.status = 'available' AND i.node = node_id
          AND (ids IS NULL
               OR (i.id, i.token) IN (SELECT * FROM unnest(ids, tokens)))
        RETURNING 1
    )
    SELECT count(*)::integer FROM r
$$;
