-- Nodes silent for $1 seconds that hold no executing row.
DELETE FROM __S__.nodes n
WHERE n.heartbeat_at < now() - make_interval(secs => $1)
  AND NOT EXISTS (SELECT 1 FROM __S__.instances i
                  WHERE i.status = 'executing' AND i.node = n.id)
