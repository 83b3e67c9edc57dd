-- Run again now the instances filter $1..$6 names, up to $8 after id $7
-- (see matching): a scheduled one (a retry waiting out its backoff, a
-- delay, a snooze) keeps its attempts; a discarded or cancelled one gets its
-- step's attempts afresh. Not one whose unique identity another instance
-- holds now. $9: the reason recorded; $10: the wake channel. Returns each
-- instance named, the status it had and whether it was made runnable.
WITH prev AS (
    SELECT id, status FROM __S__.instances
    WHERE id IN (SELECT __S__.matching($1, $2, $3, $4, $5, $6, $7, $8))
    FOR UPDATE
), upd AS (
    UPDATE __S__.instances i SET
        status = 'available',
        attempt = CASE WHEN p.status = 'scheduled' THEN i.attempt ELSE 0 END,
        scheduled_at = now(), finished_at = NULL, cancel_requested = false,
        await_signal = NULL, await_until = NULL, parked = NULL, node = NULL,
        errors = i.errors || jsonb_build_array(jsonb_build_object(
            'kind', 'retry', 'message', $9::text, 'at', now()))
    FROM prev p
    WHERE i.id = p.id AND p.status IN ('scheduled', 'discarded', 'cancelled')
      AND NOT (i.unique_key IS NOT NULL AND EXISTS (
          SELECT 1 FROM __S__.instances o
          WHERE o.unique_key = i.unique_key AND o.id <> i.id AND o.status = ANY (o.unique_states)))
    RETURNING i.id, i.queue
), notified AS (
    SELECT pg_notify($10, q) FROM (SELECT DISTINCT queue AS q FROM upd) d
)
SELECT p.id, p.status, EXISTS (SELECT 1 FROM upd u WHERE u.id = p.id) AS changed,
       (SELECT count(*) FROM notified) AS notified
FROM prev p ORDER BY p.id
