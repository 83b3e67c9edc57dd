-- Add a node's counts ($1: node; $2 started, $3 failed, $4 completed) to the
-- current minute by the database's clock, and drop rows older than a day.
WITH gone AS (
    DELETE FROM __S__.throughput WHERE minute < now() - interval '1 day')
INSERT INTO __S__.throughput AS t (minute, node, started, failed, completed)
VALUES (date_trunc('minute', now()), $1, $2, $3, $4)
ON CONFLICT (minute, node) DO UPDATE
SET started = t.started + excluded.started,
    failed = t.failed + excluded.failed,
    completed = t.completed + excluded.completed
