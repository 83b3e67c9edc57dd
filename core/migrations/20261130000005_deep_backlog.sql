-- The pick on a deep backlog (a million rows, thousands of K = 1 keys, a
-- saturated gate) took 3.8 s a call, as measured with auto_explain:
--
-- * 3.4 s of it was JIT compilation. The generic plan cannot know the LIMITs
--   (parameters), so its row estimates run to billions, far above
--   jit_above_cost, and PostgreSQL compiled 310 functions on every call.
--   The engine's functions now run with jit = off: their statements touch a
--   few hundred rows at most.
-- * 0.4 s was the final UPDATE: with those estimates it joined the chosen rows
--   to a sequential scan and sort of the whole table. It now takes the chosen
--   rows as arrays, unnested: a small estimate, so one primary-key probe per
--   row whatever the plan guesses about the CTEs before it. The claimed rows
--   come back sorted in pick order rather than in whatever order the plan
--   produced them.
--
-- pick() is restated from 20261130000002 with only that UPDATE changed.

CREATE OR REPLACE FUNCTION pick(text, integer, integer, text[], text, text[], integer[], integer[],
                     text[], float8[], float8[])
RETURNS SETOF claim
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    WITH win AS MATERIALIZED (
        SELECT i.id, i.priority, i.scheduled_at, i.concurrency_key AS ckey, i.rate_key AS rkey, i.attempt,
               array_position($6::text[], split_part(i.concurrency_key, ':', 1)) AS gi,
               array_position($9::text[], split_part(i.rate_key, ':', 1)) AS ri
        FROM instances i
        WHERE i.queue = $1 AND i.status = 'available' AND i.node IS NULL AND i.workflow = ANY ($4::text[])
          AND (i.concurrency_key IS NULL
               OR CASE WHEN array_position($6::text[], split_part(i.concurrency_key, ':', 1)) IS NULL
                       THEN NOT EXISTS (SELECT 1 FROM instances e
                                        WHERE e.status = 'executing' AND e.gate_shard IS NULL
                                          AND e.concurrency_key = i.concurrency_key)
                       ELSE (SELECT sum(s.available) FROM gate_slots s
                             WHERE s.key = i.concurrency_key) IS DISTINCT FROM 0
                  END)
          AND (i.rate_key IS NULL
               OR array_position($9::text[], split_part(i.rate_key, ':', 1)) IS NULL
               OR NOT EXISTS (SELECT 1 FROM rate_state rs
                              WHERE rs.key = i.rate_key
                                AND rs.tat > now() + make_interval(secs =>
                                    $11[array_position($9::text[], split_part(i.rate_key, ':', 1))])))
        ORDER BY i.priority, i.scheduled_at, i.id
        LIMIT $3
        FOR UPDATE OF i SKIP LOCKED
    ), ranked AS MATERIALIZED (
        SELECT w.*, row_number() OVER (PARTITION BY w.ckey ORDER BY w.priority, w.scheduled_at, w.id) AS krank
        FROM win w
    ), gkeys AS MATERIALIZED (
        SELECT DISTINCT ckey, gi FROM ranked WHERE gi IS NOT NULL
    ), shards AS MATERIALIZED (
        SELECT s.key, s.shard, s.available FROM gate_slots s
        WHERE s.key IN (SELECT ckey FROM gkeys) AND s.available > 0
        ORDER BY s.key, s.shard
        FOR UPDATE SKIP LOCKED
    ), gmint AS MATERIALIZED (
        SELECT k.ckey FROM gkeys k
        WHERE NOT EXISTS (SELECT 1 FROM gate_slots s WHERE s.key = k.ckey)
          AND may_mint_gate(k.ckey)
    ), gcap AS MATERIALIZED (
        SELECT k.ckey, k.gi, m.ckey IS NOT NULL AS fresh,
               CASE WHEN m.ckey IS NOT NULL THEN $7[k.gi]
                    ELSE coalesce((SELECT sum(s.available) FROM shards s WHERE s.key = k.ckey), 0)
               END AS cap
        FROM gkeys k LEFT JOIN gmint m ON m.ckey = k.ckey
    ), rkeys AS MATERIALIZED (
        SELECT DISTINCT rkey, ri FROM ranked WHERE ri IS NOT NULL
    ), rlocked AS MATERIALIZED (
        SELECT rs.key, rs.tat FROM rate_state rs
        WHERE rs.key IN (SELECT rkey FROM rkeys)
        ORDER BY rs.key
        FOR UPDATE SKIP LOCKED
    ), rmint AS MATERIALIZED (
        SELECT k.rkey FROM rkeys k
        WHERE NOT EXISTS (SELECT 1 FROM rate_state rs WHERE rs.key = k.rkey)
          AND may_mint_rate(k.rkey)
    ), rallow AS MATERIALIZED (
        -- GCRA: a start at t conforms while tat <= t + tolerance; each takes one interval.
        SELECT k.rkey, m.rkey IS NOT NULL AS fresh,
               CASE WHEN m.rkey IS NOT NULL THEN floor($11[k.ri] / $10[k.ri] + 1e-9)::integer + 1
                    WHEN l.key IS NULL THEN 0
                    WHEN greatest(l.tat, now()) <= now() + make_interval(secs => $11[k.ri])
                    THEN floor((extract(epoch FROM now() - greatest(l.tat, now()))::float8 + $11[k.ri])
                               / $10[k.ri] + 1e-9)::integer + 1
                    ELSE 0
               END AS allowed
        FROM rkeys k
        LEFT JOIN rlocked l ON l.key = k.rkey
        LEFT JOIN rmint m ON m.rkey = k.rkey
    ), cand AS MATERIALIZED (
        SELECT r.*, row_number() OVER (PARTITION BY r.rkey ORDER BY r.priority, r.scheduled_at, r.id) AS rrank
        FROM ranked r LEFT JOIN gcap g ON g.ckey = r.ckey
        WHERE r.ckey IS NULL
           OR (r.gi IS NULL AND r.krank = 1)
           OR (r.gi IS NOT NULL AND r.krank <= g.cap)
    ), chosen AS MATERIALIZED (
        SELECT c.id, c.priority, c.scheduled_at, c.ckey, c.gi, c.rkey, c.ri, c.attempt, a.fresh AS rfresh
        FROM cand c LEFT JOIN rallow a ON a.rkey = c.rkey
        WHERE (c.ri IS NULL OR c.rrank <= a.allowed)
          AND (c.ckey IS NULL OR c.gi IS NOT NULL OR claim_key(c.ckey))
        ORDER BY c.priority, c.scheduled_at, c.id
        LIMIT $2
    ), gpick AS (
        SELECT c.id, c.ckey, c.gi, g.fresh,
               row_number() OVER (PARTITION BY c.ckey ORDER BY c.priority, c.scheduled_at, c.id) AS j
        FROM chosen c JOIN gcap g ON g.ckey = c.ckey
        WHERE c.gi IS NOT NULL
    ), ranges AS (
        SELECT s.key, s.shard, s.available,
               sum(s.available) OVER (PARTITION BY s.key ORDER BY s.shard) AS hi
        FROM shards s
    ), gassign AS MATERIALIZED (
        -- Fresh keys spread round-robin over all shards; existing ones fill the
        -- locked shards in order.
        SELECT p.id, p.ckey, p.gi, p.fresh,
               CASE WHEN p.fresh THEN ((p.j - 1) % least($8[p.gi], $7[p.gi]))::integer
                    ELSE (SELECT r.shard FROM ranges r
                          WHERE r.key = p.ckey AND p.j > r.hi - r.available AND p.j <= r.hi)
               END AS shard
        FROM gpick p
    ), minted AS (
        INSERT INTO gate_slots (key, shard, capacity, available)
        SELECT m.ckey, s.shard, cp.capacity,
               cp.capacity - (SELECT count(*) FROM gassign a WHERE a.ckey = m.ckey AND a.shard = s.shard)
        FROM (SELECT DISTINCT ckey, gi FROM gassign WHERE fresh) m
        CROSS JOIN LATERAL generate_series(0, least($8[m.gi], $7[m.gi]) - 1) AS s(shard)
        CROSS JOIN LATERAL (
            SELECT ($7[m.gi] / least($8[m.gi], $7[m.gi])
                    + CASE WHEN s.shard < $7[m.gi] % least($8[m.gi], $7[m.gi]) THEN 1 ELSE 0 END)::integer
                   AS capacity) cp
        ORDER BY 1, 2
        RETURNING 1
    ), debited AS (
        -- New values come from the versions this statement locked (shards,
        -- rlocked), never from the UPDATE's own scan: that scan reads the
        -- statement snapshot, which may predate a credit committed before the lock.
        UPDATE gate_slots s SET available = d.available - d.n
        FROM (SELECT a.ckey, a.shard, sh.available, count(*)::integer AS n
              FROM gassign a JOIN shards sh ON sh.key = a.ckey AND sh.shard = a.shard
              WHERE NOT a.fresh GROUP BY 1, 2, 3) d
        WHERE s.key = d.ckey AND s.shard = d.shard
        RETURNING 1
    ), rdebit AS (
        SELECT rkey, ri, rfresh, count(*)::integer AS n FROM chosen WHERE ri IS NOT NULL GROUP BY 1, 2, 3
    ), rminted AS (
        INSERT INTO rate_state (key, tat)
        SELECT rkey, now() + make_interval(secs => n * $10[ri]) FROM rdebit WHERE rfresh
        ORDER BY 1
        RETURNING 1
    ), rdebited AS (
        UPDATE rate_state rs SET tat = greatest(l.tat, now()) + make_interval(secs => d.n * $10[d.ri])
        FROM rdebit d JOIN rlocked l ON l.key = d.rkey
        WHERE NOT d.rfresh AND rs.key = d.rkey
        RETURNING 1
    ), claimed AS (
        UPDATE instances i
        SET status = 'executing', node = $5, attempt = c.attempt + 1, attempted_at = now(),
            gate_shard = c.shard
        FROM (SELECT array_agg(c.id) AS id, array_agg(c.attempt) AS attempt, array_agg(a.shard) AS shard
              FROM chosen c LEFT JOIN gassign a ON a.id = c.id) agg
        CROSS JOIN LATERAL unnest(agg.id, agg.attempt, agg.shard) AS c(id, attempt, shard)
        WHERE i.id = c.id
        RETURNING i.id, i.workflow, i.step, i.state, i.queue, i.priority, i.attempt, i.max_attempts,
                  i.concurrency_key, i.gate_shard, i.rate_key, i.wake, i.scheduled_at
    )
    -- In pick order: the node starts the rows in the order they come back.
    SELECT id, workflow, step, state, queue, priority, attempt, max_attempts, concurrency_key,
           gate_shard, rate_key, wake
    FROM claimed
    ORDER BY priority, scheduled_at, id;
END
$$;

ALTER FUNCTION handoff(jsonb, text, text, boolean, text[], integer[], boolean[], boolean[], bigint[],
                       float8, text[], text[], integer[], integer[], text[], float8[], float8[])
    SET jit = off;
ALTER FUNCTION release_reserved(text, bigint[]) SET jit = off;
ALTER FUNCTION reconcile_gates() SET jit = off;
