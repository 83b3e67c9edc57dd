-- Up to $2 rows final for longer than $1 seconds.
DELETE FROM __S__.instances WHERE id IN (
    SELECT id FROM __S__.instances
    WHERE status IN ('completed', 'cancelled', 'discarded')
      AND finished_at < now() - make_interval(secs => $1)
    LIMIT $2)
