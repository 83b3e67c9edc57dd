-- Up to $2 rows final for longer than $1 seconds, with the signals kept for
-- them; and signals sent by name that expired. Rows another node's pruner
-- (or an operator's retry) holds are skipped, not waited for.
WITH gone AS (
    DELETE FROM __S__.instances WHERE id IN (
        SELECT id FROM __S__.instances
        WHERE status IN ('completed', 'cancelled', 'discarded')
          AND finished_at < now() - make_interval(secs => $1)
        LIMIT $2
        FOR UPDATE SKIP LOCKED)
    RETURNING id
), letters AS (
    DELETE FROM __S__.mailbox WHERE instance IN (SELECT id FROM gone)
), expired AS (
    DELETE FROM __S__.mailbox WHERE instance IS NULL AND expires_at < now()
)
SELECT count(*) FROM gone
