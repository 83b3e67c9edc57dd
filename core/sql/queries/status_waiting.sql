-- Rows waiting per workflow and queue, and whether no live node (heartbeat
-- within $1 seconds) serves the queue or runs the workflow. Grouped first,
-- so the live nodes are matched once per group, not once per row. A live
-- node that recorded no workflows (NULL) may run any of them.
WITH live AS (
    SELECT n.queues, n.workflows FROM __S__.nodes n
    WHERE n.heartbeat_at > now() - make_interval(secs => $1)),
waiting AS (
    SELECT workflow, queue, count(*) AS n, min(scheduled_at) AS oldest
    FROM __S__.instances WHERE status IN ('available', 'scheduled')
    GROUP BY 1, 2)
SELECT * FROM (
    SELECT w.workflow, w.queue, w.n, w.oldest,
           CASE WHEN NOT EXISTS (SELECT 1 FROM live l WHERE l.queues ? w.queue)
                THEN 'queue'
                WHEN NOT EXISTS (SELECT 1 FROM live l
                                 WHERE l.queues ? w.queue
                                   AND coalesce(l.workflows ? w.workflow, true))
                THEN 'workflow'
           END AS no_node
    FROM waiting w) r
ORDER BY r.no_node IS NULL, r.workflow, r.queue
LIMIT 1000
