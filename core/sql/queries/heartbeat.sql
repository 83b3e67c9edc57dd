-- Registers node $1 (hostname $2, pid $3) with its queues ($4), workflows
-- ($6) and lease ($5 seconds). Also answers how many other nodes are alive
-- (heartbeat within $5 s), and how many seconds ago this node's previous
-- heartbeat was recorded (NULL: none, or its row was deleted as dead).
WITH prev AS (SELECT heartbeat_at FROM __S__.nodes WHERE id = $1),
beat AS (INSERT INTO __S__.nodes (id, hostname, pid, queues, workflows, lease_s)
         VALUES ($1, $2, $3, $4, $6, $5)
         ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), queues = excluded.queues,
                                        workflows = excluded.workflows, lease_s = excluded.lease_s
         RETURNING 1)
SELECT (SELECT count(*) FROM __S__.nodes n
        WHERE n.id <> $1 AND n.heartbeat_at > now() - make_interval(secs => $5)),
       (SELECT extract(epoch FROM now() - heartbeat_at)::float8 FROM prev),
       (SELECT count(*) FROM beat)
