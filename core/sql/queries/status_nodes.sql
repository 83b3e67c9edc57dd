-- Nodes that heartbeated within $1 seconds.
SELECT n.id, n.hostname, n.pid, n.queues, n.started_at, n.heartbeat_at,
       (SELECT count(*) FROM __S__.instances i WHERE i.status = 'executing' AND i.node = n.id),
       n.workflows
FROM __S__.nodes n WHERE n.heartbeat_at > now() - make_interval(secs => $1)
ORDER BY n.id
