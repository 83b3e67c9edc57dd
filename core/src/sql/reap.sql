-- Rescue rows executing on nodes whose heartbeat is older than the lease ($1
-- seconds). The attempt was counted by the claim; at max_attempts the row is
-- discarded. Gate counters are not credited here (the safe direction): the
-- reconciler restores them from the executing rows. Rows the dead nodes
-- reserved as successors go back to everyone.
WITH lost AS (
    SELECT i.id, i.cancel_requested, i.attempt, i.max_attempts, i.errors, i.step, i.node
    FROM __S__.instances i
    WHERE i.status = 'executing'
      AND NOT EXISTS (SELECT 1 FROM __S__.nodes n
                      WHERE n.id = i.node AND n.heartbeat_at > now() - make_interval(secs => $1))
    FOR UPDATE OF i SKIP LOCKED
), rescued AS (
    -- Values come from the locked versions (lost), not the UPDATE's snapshot.
    UPDATE __S__.instances i SET
        status = CASE WHEN l.cancel_requested THEN 'cancelled'
                      WHEN l.attempt >= l.max_attempts THEN 'discarded'
                      ELSE 'available' END,
        finished_at = CASE WHEN l.cancel_requested OR l.attempt >= l.max_attempts THEN now() END,
        errors = l.errors || jsonb_build_array(jsonb_build_object(
            'kind', 'lost', 'step', l.step, 'attempt', l.attempt, 'node', l.node, 'at', now(),
            'message', 'node ' || coalesce(l.node, '?') || ' stopped heartbeating while the step ran')),
        node = NULL,
        gate_shard = NULL,
        scheduled_at = now()
    FROM lost l WHERE i.id = l.id
    RETURNING i.id
), unreserved AS (
    SELECT __S__.release_reserved(n.node, NULL) AS n
    FROM (SELECT DISTINCT i.node FROM __S__.instances i
          WHERE i.status = 'available' AND i.node IS NOT NULL
            AND NOT EXISTS (SELECT 1 FROM __S__.nodes n
                            WHERE n.id = i.node AND n.heartbeat_at > now() - make_interval(secs => $1))) n
)
SELECT count(*) AS rescued,
       (SELECT count(*) FROM (SELECT pg_notify($2, '')
                              WHERE EXISTS (SELECT 1 FROM rescued)
                                 OR (SELECT sum(n) FROM unreserved) > 0) n) AS notified
FROM rescued
