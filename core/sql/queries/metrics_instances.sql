-- Instances per queue in the statuses before final ones (what waits and
-- runs: bounded by the backlog, not by history; finished ones are counted
-- by the nodes' step counters).
SELECT queue, status, count(*) FROM __S__.instances
WHERE status IN ('scheduled', 'available', 'executing', 'awaiting')
GROUP BY 1, 2 ORDER BY 1, 2
