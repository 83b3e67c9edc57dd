-- Instances waiting or running, per queue and status: the backlog, never
-- the finished history. Each part reads the partial index that holds its
-- rows (the literal predicates let the planner prove it), so the cost
-- follows the backlog, not the table: scheduled, available (unparked, and
-- parked for a key, a rate limit, a workflow: together every available
-- row), executing, awaiting (a signal, or else a time: every await has one).
SELECT queue, status, sum(n)::bigint FROM (
    SELECT queue, 'scheduled' AS status, count(*) AS n FROM __S__.instances
    WHERE status = 'scheduled' GROUP BY 1
    UNION ALL
    SELECT queue, 'available', count(*) FROM __S__.instances
    WHERE status = 'available' AND parked IS NULL GROUP BY 1
    UNION ALL
    SELECT queue, 'available', count(*) FROM __S__.instances
    WHERE status = 'available' AND parked = 'key' GROUP BY 1
    UNION ALL
    SELECT queue, 'available', count(*) FROM __S__.instances
    WHERE status = 'available' AND parked = 'rate' GROUP BY 1
    UNION ALL
    SELECT queue, 'available', count(*) FROM __S__.instances
    WHERE status = 'available' AND parked = 'workflow' GROUP BY 1
    UNION ALL
    SELECT queue, 'executing', count(*) FROM __S__.instances
    WHERE status = 'executing' GROUP BY 1
    UNION ALL
    SELECT queue, 'awaiting', count(*) FROM __S__.instances
    WHERE status = 'awaiting' AND await_signal IS NOT NULL GROUP BY 1
    UNION ALL
    SELECT queue, 'awaiting', count(*) FROM __S__.instances
    WHERE status = 'awaiting' AND await_signal IS NULL AND await_until IS NOT NULL GROUP BY 1
) x
GROUP BY 1, 2 ORDER BY 1, 2
