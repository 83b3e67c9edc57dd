-- Up to $2 rows final for longer than $1 seconds, oldest first from
-- finished_at $3 on (NULL: the oldest), with the signals kept for them; and
-- signals sent by name that expired. Returns how many went and the last
-- one's finished_at: the next batch starts there, past the index entries of
-- the rows just deleted (dead until a vacuum, but walked by every scan from
-- the start). Rows another node's pruner (or an operator's retry) holds are
-- skipped, not waited for.
WITH doomed AS (
    SELECT id, finished_at FROM __S__.instances
    WHERE status IN ('completed', 'cancelled', 'discarded')
      AND finished_at < now() - make_interval(secs => $1)
      AND finished_at >= coalesce($3, '-infinity'::timestamptz)
    ORDER BY finished_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM __S__.instances i USING doomed d WHERE i.id = d.id
    RETURNING i.id, d.finished_at
), letters AS (
    DELETE FROM __S__.mailbox WHERE instance IN (SELECT id FROM gone)
), expired AS (
    DELETE FROM __S__.mailbox WHERE instance IS NULL AND expires_at < now()
)
SELECT count(*), max(finished_at) FROM gone
