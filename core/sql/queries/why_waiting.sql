-- What instance $1 waits for, from the rows and counters that decide it
-- (engine/inspect/why.rs); $2: the lease in seconds (a node heartbeating
-- within it is live); $3: rows ahead of it counted up to this many. Each
-- part reads an index: the K = 1 holder through instances_k1, a gate's
-- in-flight rows through instances_gated, the rows ahead through
-- instances_pick.
SELECT i.status, i.queue, i.workflow, i.concurrency_key, i.rate_key, i.parked, i.node,
       i.scheduled_at, i.attempted_at, i.await_signal, i.await_until, now(),
       (SELECT p.paused_at FROM __S__.queue_pauses p WHERE p.queue = i.queue),
       h.id, h.node, h.attempted_at,
       (SELECT sum(g.capacity)::bigint FROM __S__.gate_slots g WHERE g.key = i.concurrency_key),
       (SELECT count(*) FROM __S__.instances f
        WHERE f.status = 'executing' AND f.gate_shard IS NOT NULL
          AND f.concurrency_key = i.concurrency_key),
       (SELECT r.tat FROM __S__.rate_state r WHERE r.key = i.rate_key),
       EXISTS (SELECT 1 FROM __S__.nodes n
               WHERE n.heartbeat_at > now() - make_interval(secs => $2) AND n.queues ? i.queue),
       EXISTS (SELECT 1 FROM __S__.nodes n
               WHERE n.heartbeat_at > now() - make_interval(secs => $2) AND n.queues ? i.queue
                 AND coalesce(n.workflows ? i.workflow, true)),
       (SELECT n.heartbeat_at FROM __S__.nodes n WHERE n.id = i.node),
       CASE WHEN i.status = 'available' AND i.parked IS NULL THEN
           (SELECT count(*) FROM (SELECT 1 FROM __S__.instances a
                                  WHERE a.status = 'available' AND a.parked IS NULL
                                    AND a.queue = i.queue
                                    AND (a.priority, a.scheduled_at, a.id)
                                        < (i.priority, i.scheduled_at, i.id)
                                  LIMIT $3) x)
       END
FROM __S__.instances i
LEFT JOIN LATERAL (
    SELECT k.id, k.node, k.attempted_at FROM __S__.instances k
    WHERE k.status = 'executing' AND k.gate_shard IS NULL
      AND k.concurrency_key = i.concurrency_key AND k.id <> i.id) h ON true
WHERE i.id = $1
