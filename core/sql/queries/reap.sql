-- Rescue rows executing on nodes presumed dead: heartbeat older than the
-- lease ($1 seconds), no claim within the lease (a node that claims is
-- alive, whatever its heartbeat says), and the server itself up for longer
-- than the lease (after a restart every node needs time to heartbeat
-- again). With $3 set, rescue the rows of node $3 whatever its heartbeat: a
-- node starting under the id of a process that ended takes back what that
-- process held. The attempt was counted by the claim, so a step that kills
-- its process reaches max_attempts; the loss is recorded in `errors`. Gate
-- counters are not credited here (the safe direction): the reconciler
-- restores them from the executing rows. Rows the same nodes reserved as
-- successors go back to everyone in the same pass.
WITH dead AS (
    SELECT n.id FROM __S__.nodes n
    WHERE $3::text IS NULL AND n.heartbeat_at <= now() - make_interval(secs => $1)
), lost AS (
    SELECT i.id, i.cancel_requested, i.attempt, i.max_attempts, i.errors, i.step, i.node
    FROM __S__.instances i
    WHERE i.status = 'executing'
      AND CASE WHEN $3::text IS NOT NULL THEN i.node = $3
               ELSE pg_postmaster_start_time() < now() - make_interval(secs => $1)
                    AND NOT EXISTS (SELECT 1 FROM __S__.nodes n
                                    WHERE n.id = i.node AND n.heartbeat_at > now() - make_interval(secs => $1))
                    AND NOT EXISTS (SELECT 1 FROM __S__.instances c
                                    WHERE c.status = 'executing' AND c.node = i.node
                                      AND c.attempted_at > now() - make_interval(secs => $1))
          END
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
            'message', CASE WHEN $3::text IS NULL
                            THEN 'node ' || coalesce(l.node, '?') || ' stopped heartbeating while the step ran'
                            ELSE 'the process of node ' || l.node || ' ended while the step ran'
                       END)),
        node = NULL,
        gate_shard = NULL,
        scheduled_at = now()
    FROM lost l WHERE i.id = l.id
    RETURNING i.id
), unreserved AS (
    SELECT coalesce(sum(__S__.release_reserved(r.node, NULL, NULL)), 0) AS n
    FROM (SELECT DISTINCT i.node FROM __S__.instances i
          WHERE i.status = 'available' AND i.node IS NOT NULL
            AND (i.node = $3 OR i.node IN (SELECT id FROM dead)
                 OR NOT EXISTS (SELECT 1 FROM __S__.nodes n WHERE n.id = i.node))) r
), counts AS MATERIALIZED (
    SELECT (SELECT count(*) FROM rescued) AS rescued, (SELECT n FROM unreserved) AS unreserved
)
SELECT c.rescued, c.unreserved,
       (SELECT count(*) FROM (SELECT pg_notify($2, '') WHERE c.rescued + c.unreserved > 0) n) AS notified
FROM counts c
