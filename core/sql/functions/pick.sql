-- The pick: claim up to `demand` runnable rows of queue `q` for node
-- `node_id`, admitting each through its K = 1 key, its gate and its rate
-- limit, in one statement; then park the rows it found blocked.
--
-- `win_size`: rows of the queue to look at; `wfs`: the workflows the node
-- runs; `gate_names`/`gate_limits`/`gate_shards` and `rate_names`/
-- `rate_intervals`/`rate_tolerances` (GCRA, seconds): the configuration.
-- gi and ri index those arrays.
--
-- Phases: (1) a window of candidates, locked (parked rows are not in the
-- index it walks); (2) lock the counters the window needs (SKIP LOCKED:
-- pickers take disjoint shards) and decide which fresh keys this pick mints;
-- choose rows that pass every limit; mint and debit exactly for the chosen
-- rows, then claim (a row one limit rejects debits no other limit);
-- (3) park the window's rows that cannot run now.
CREATE OR REPLACE FUNCTION pick(q text, demand integer, win_size integer, wfs text[], node_id text,
                                gate_names text[], gate_limits integer[], gate_shards integer[],
                                rate_names text[], rate_intervals float8[], rate_tolerances float8[])
RETURNS SETOF claim
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    -- The window, column by column.
    w_id bigint[];
    w_priority smallint[];
    w_at timestamptz[];
    w_key text[];
    w_rate text[];
    limited boolean;
    -- Rows to park for their key and for their rate limit.
    p_key bigint[];
    p_rate bigint[];
    -- Keys whose rows waited behind their own parked rows.
    p_behind text[];
    n_rate integer;
    -- Keyed rows this pick may claim (NULL: no cap).
    k_room integer;
    -- The rows to claim, and the gate shard each takes.
    c_id bigint[];
    c_shard integer[];
    share_left boolean;
BEGIN
    -- (1) The window: the queue's next rows, locked. Parked rows are not in
    -- the index it walks.
    SELECT array_agg(w.id), array_agg(w.priority), array_agg(w.scheduled_at), array_agg(w.concurrency_key),
           array_agg(w.rate_key),
           bool_or(w.concurrency_key IS NOT NULL OR w.rate_key IS NOT NULL)
    INTO w_id, w_priority, w_at, w_key, w_rate, limited
    FROM (SELECT i.id, i.priority, i.scheduled_at, i.concurrency_key, i.rate_key
          FROM instances i
          WHERE i.queue = q AND i.status = 'available' AND i.parked IS NULL AND i.node IS NULL
            AND i.workflow = ANY (wfs)
          ORDER BY i.priority, i.scheduled_at, i.id
          LIMIT win_size
          FOR UPDATE OF i SKIP LOCKED) w;
    IF w_id IS NULL THEN
        RETURN;
    END IF;

    -- A window without keys or rate limits admits every row: its first
    -- `demand` rows are claimed straight away, and there is nothing to park.
    -- Keyless backlogs are the common case at high rates, and the admission
    -- below (its sorts, counters and joins) cost them about a fifth of the pick.
    IF NOT limited THEN
        c_id := ARRAY(SELECT w.id FROM unnest(w_id, w_priority, w_at) AS w(id, priority, at)
                      ORDER BY w.priority, w.at, w.id
                      LIMIT demand);
    ELSE
        -- A node that shares the queue holds its share of the keys in play
        -- (node_key_room), those free in this window counted with the held.
        k_room := node_key_room(q, node_id, w_key);

        -- (2) Admit: choose the rows, debit their limits. Only the window's
        -- limited rows go through the admission; its keyless rows join them
        -- at the choice (`chosen`), in the claim order. A window of keyless
        -- rows behind one limited head (a rate-limited row its limit just
        -- allowed, a gate row unparked into a freed slot) paid the
        -- admission's joins and window functions for every row.
        WITH win AS MATERIALIZED (
            SELECT w.*,
                   array_position(gate_names, split_part(w.ckey, ':', 1)) AS gi,
                   array_position(rate_names, split_part(w.rkey, ':', 1)) AS ri
            FROM unnest(w_id, w_priority, w_at, w_key, w_rate)
                 AS w(id, priority, scheduled_at, ckey, rkey)
            WHERE w.ckey IS NOT NULL OR w.rkey IS NOT NULL
        ), ranked AS MATERIALIZED (
            SELECT w.*, row_number() OVER (PARTITION BY w.ckey ORDER BY w.priority, w.scheduled_at, w.id) AS krank,
                   (w.ckey IS NOT NULL AND w.gi IS NULL
                    AND EXISTS (SELECT 1 FROM instances e
                                WHERE e.status = 'executing' AND e.gate_shard IS NULL
                                  AND e.concurrency_key = w.ckey)) AS k1busy,
                   -- A row of its key in this queue waits parked ahead of it (a
                   -- row switched into the key, a rescued or signalled one, one
                   -- that arrived before a row that sorts first): it waits its
                   -- turn (parked below; the key's head is unparked instead).
                   coalesce((f.priority, f.scheduled_at, f.id) < (w.priority, w.scheduled_at, w.id), false)
                       AS behind
            FROM win w
            -- The key's first parked row in this queue, read in the parking
            -- index's order (a bare EXISTS let a generic plan scan the table).
            LEFT JOIN LATERAL (
                SELECT p.priority, p.scheduled_at, p.id FROM instances p
                WHERE p.concurrency_key = w.ckey AND p.status = 'available' AND p.parked = 'key'
                  AND p.queue = q
                ORDER BY p.priority, p.scheduled_at, p.id
                LIMIT 1) f ON w.ckey IS NOT NULL
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
                   CASE WHEN m.ckey IS NOT NULL THEN gate_limits[k.gi]
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
                   CASE WHEN m.rkey IS NOT NULL THEN floor(rate_tolerances[k.ri] / rate_intervals[k.ri] + 1e-9)::integer + 1
                        WHEN l.key IS NULL THEN 0
                        WHEN greatest(l.tat, now()) <= now() + make_interval(secs => rate_tolerances[k.ri])
                        THEN floor((extract(epoch FROM now() - greatest(l.tat, now()))::float8 + rate_tolerances[k.ri])
                                   / rate_intervals[k.ri] + 1e-9)::integer + 1
                        ELSE 0
                   END AS allowed
            FROM rkeys k
            LEFT JOIN rlocked l ON l.key = k.rkey
            LEFT JOIN rmint m ON m.rkey = k.rkey
        ), cand AS MATERIALIZED (
            SELECT r.*, row_number() OVER (PARTITION BY r.rkey ORDER BY r.priority, r.scheduled_at, r.id) AS rrank,
                   count(*) FILTER (WHERE r.ckey IS NOT NULL)
                       OVER (ORDER BY r.priority, r.scheduled_at, r.id) AS kn
            FROM ranked r LEFT JOIN gcap g ON g.ckey = r.ckey
            WHERE r.ckey IS NULL
               OR (r.gi IS NULL AND r.krank = 1 AND NOT r.k1busy AND NOT r.behind)
               OR (r.gi IS NOT NULL AND r.krank <= g.cap AND NOT r.behind)
        ), chosen AS MATERIALIZED (
            SELECT * FROM (
                SELECT c.id, c.priority, c.scheduled_at, c.ckey, c.gi, c.rkey, c.ri, a.fresh AS rfresh
                FROM cand c LEFT JOIN rallow a ON a.rkey = c.rkey
                WHERE (c.ri IS NULL OR c.rrank <= a.allowed)
                  AND (c.ckey IS NULL OR k_room IS NULL OR c.kn <= k_room)
                  AND (c.ckey IS NULL OR c.gi IS NOT NULL OR claim_key(c.ckey))
                UNION ALL
                SELECT w.id, w.priority, w.scheduled_at, NULL, NULL, NULL, NULL, NULL
                FROM unnest(w_id, w_priority, w_at, w_key, w_rate) AS w(id, priority, scheduled_at, ckey, rkey)
                WHERE w.ckey IS NULL AND w.rkey IS NULL) u
            ORDER BY u.priority, u.scheduled_at, u.id
            LIMIT demand
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
                   CASE WHEN p.fresh THEN ((p.j - 1) % least(gate_shards[p.gi], gate_limits[p.gi]))::integer
                        ELSE (SELECT r.shard FROM ranges r
                              WHERE r.key = p.ckey AND p.j > r.hi - r.available AND p.j <= r.hi)
                   END AS shard
            FROM gpick p
        ), minted AS (
            INSERT INTO gate_slots (key, shard, capacity, available)
            SELECT m.ckey, s.shard, cp.capacity,
                   cp.capacity - (SELECT count(*) FROM gassign a WHERE a.ckey = m.ckey AND a.shard = s.shard)
            FROM (SELECT DISTINCT ckey, gi FROM gassign WHERE fresh) m
            CROSS JOIN LATERAL generate_series(0, least(gate_shards[m.gi], gate_limits[m.gi]) - 1) AS s(shard)
            CROSS JOIN LATERAL (
                SELECT (gate_limits[m.gi] / least(gate_shards[m.gi], gate_limits[m.gi])
                        + CASE WHEN s.shard < gate_limits[m.gi] % least(gate_shards[m.gi], gate_limits[m.gi]) THEN 1 ELSE 0 END)::integer
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
            SELECT rkey, now() + make_interval(secs => n * rate_intervals[ri]) FROM rdebit WHERE rfresh
            ORDER BY 1
            RETURNING 1
        ), rdebited AS (
            UPDATE rate_state rs SET tat = greatest(l.tat, now()) + make_interval(secs => d.n * rate_intervals[d.ri])
            FROM rdebit d JOIN rlocked l ON l.key = d.rkey
            WHERE NOT d.rfresh AND rs.key = d.rkey
            RETURNING 1
        )
        SELECT array_agg(c.id), array_agg(a.shard),
               -- Runnable keyed rows left for the other nodes' shares.
               k_room IS NOT NULL AND count(*) < demand
               AND EXISTS (SELECT 1 FROM cand r WHERE r.ckey IS NOT NULL AND r.kn > k_room)
        INTO c_id, c_shard, share_left
        FROM chosen c LEFT JOIN gassign a ON a.id = c.id;
        -- Another node's pick running beside this one skipped them (this
        -- window held their locks) and may have come back short: it only
        -- picks again when woken, so the call wakes the other nodes (read
        -- by handoff, as `rate_parked` is).
        IF share_left THEN
            PERFORM set_config('gendurable.share_left', 'on', true);
        END IF;
    END IF;

    -- Claim the chosen rows, in pick order: the node starts the rows in the
    -- order they come back. By primary key (`= ANY`, so that no plan hashes
    -- the table), each row joined to its shard (NULL on the keyless path).
    -- The shard looked up with array_position cost a search of c_id per
    -- row: 190 ms for a first pick of 7,770 rows.
    RETURN QUERY
    WITH claimed AS (
        UPDATE instances i
        SET status = 'executing', node = node_id, attempt = i.attempt + 1, attempted_at = now(),
            gate_shard = c.shard, token = i.token + 1
        FROM unnest(c_id, c_shard) AS c(id, shard)
        WHERE i.id = ANY (c_id) AND i.id = c.id
        RETURNING i.id, i.workflow, i.step, i.state, i.queue, i.priority, i.attempt, i.max_attempts,
                  i.concurrency_key, i.gate_shard, i.rate_key, i.wake, i.token, i.scheduled_at
    )
    SELECT id, workflow, step, state, queue, priority, attempt, max_attempts, concurrency_key,
           gate_shard, rate_key, wake, token
    FROM claimed
    ORDER BY priority, scheduled_at, id;

    -- (3) Park the rows of the window that cannot run now, as a fresh
    -- snapshot sees them after this pick's claims and debits: a K = 1 key
    -- executing, a gate with no slot left, a rate limit with no start left.
    -- With them go the other rows of those keys still in the pick's index
    -- (up to 10,000 a key): a key without room has no rows waiting unparked.
    -- They stay out of the pick's index until unparked (see unpark_keys).
    --
    -- What holds the key (its executing row, or every shard of its gate at
    -- zero) is locked FOR SHARE, skipping what another transaction is
    -- changing: an outcome call freeing the key either waits for this one
    -- to commit, and then its unparking sees these rows parked, or had
    -- already locked the holder, and then nothing is parked here. Read
    -- without the lock, a key freed by a call that committed after this
    -- snapshot but read the rows before they were parked was left free with
    -- its rows parked until the maintenance sweep (a second, for one key of
    -- W2 on two nodes).
    IF limited THEN
        WITH b AS (
            SELECT x.id, x.concurrency_key, x.rate_key, x.behind,
                   CASE WHEN x.behind THEN 'key'
                        WHEN x.concurrency_key IS NOT NULL
                             AND CASE WHEN array_position(gate_names, split_part(x.concurrency_key, ':', 1)) IS NULL
                                      THEN EXISTS (SELECT 1 FROM instances e
                                                   WHERE e.status = 'executing' AND e.gate_shard IS NULL
                                                     AND e.concurrency_key = x.concurrency_key
                                                   FOR SHARE OF e SKIP LOCKED)
                                      ELSE (SELECT count(*) FILTER (WHERE l.available = 0) = count(*)
                                                   AND count(*) > 0
                                                   AND count(*) = (SELECT count(*) FROM gate_slots s
                                                                   WHERE s.key = x.concurrency_key)
                                            FROM (SELECT s.available FROM gate_slots s
                                                  WHERE s.key = x.concurrency_key
                                                  FOR SHARE OF s SKIP LOCKED) l)
                                 END
                        THEN 'key'
                        WHEN x.rate_key IS NOT NULL
                             AND (EXISTS (SELECT 1 FROM rate_state rs
                                          WHERE rs.key = x.rate_key
                                            AND rs.tat > now() + make_interval(secs =>
                                                rate_tolerances[array_position(rate_names, split_part(x.rate_key, ':', 1))]))
                                  -- Its limit locked by another node's pick, which
                                  -- the admission above skipped: parked too, or
                                  -- nothing would come back to it (the unparking
                                  -- sweeps give it back as its limit allows).
                                  OR (EXISTS (SELECT 1 FROM rate_state rs WHERE rs.key = x.rate_key)
                                      AND NOT EXISTS (SELECT 1 FROM rate_state rs WHERE rs.key = x.rate_key
                                                      FOR UPDATE SKIP LOCKED)))
                        THEN 'rate'
                   END AS why
            FROM (
                -- One primary-key probe per window row, whatever the generic
                -- plan would guess about the partial indexes (OFFSET 0 keeps
                -- the probe from being flattened into a scan of instances_pick).
                SELECT y.*,
                       -- As in the admission above: a row of the key waits
                       -- parked ahead of this one.
                       coalesce((f.priority, f.scheduled_at, f.id) < (y.priority, y.scheduled_at, y.id), false)
                           AS behind
                -- Keyless rows are never parked: only the limited ones.
                FROM unnest(w_id, w_key, w_rate) AS u(id, ckey, rkey)
                CROSS JOIN LATERAL (SELECT * FROM instances i WHERE i.id = u.id OFFSET 0) y
                LEFT JOIN LATERAL (
                    SELECT p.priority, p.scheduled_at, p.id FROM instances p
                    WHERE p.concurrency_key = y.concurrency_key AND p.status = 'available'
                      AND p.parked = 'key' AND p.queue = q
                    ORDER BY p.priority, p.scheduled_at, p.id
                    LIMIT 1) f ON y.concurrency_key IS NOT NULL
                WHERE (u.ckey IS NOT NULL OR u.rkey IS NOT NULL)
                  AND y.status = 'available' AND y.node IS NULL AND y.parked IS NULL) x
        ), more AS (
            SELECT m.id, 'key' AS why
            FROM (SELECT DISTINCT concurrency_key AS key FROM b WHERE why = 'key') k
            CROSS JOIN LATERAL (
                SELECT i.id FROM instances i
                WHERE i.concurrency_key = k.key AND coalesce(i.parked, i.status) = 'available'
                  AND i.node IS NULL
                LIMIT 10000
                FOR UPDATE SKIP LOCKED) m
            UNION
            SELECT m.id, 'rate'
            FROM (SELECT DISTINCT rate_key AS key FROM b WHERE why = 'rate') k
            CROSS JOIN LATERAL (
                SELECT i.id FROM instances i
                WHERE i.rate_key = k.key AND coalesce(i.parked, i.status) = 'available'
                  AND i.node IS NULL
                LIMIT 10000
                FOR UPDATE SKIP LOCKED) m
        ), todo AS (
            SELECT DISTINCT ON (id) id, why FROM (SELECT id, why FROM b WHERE why IS NOT NULL
                                                  UNION ALL SELECT id, why FROM more) t
            ORDER BY id, why
        )
        SELECT coalesce(array_agg(t.id) FILTER (WHERE t.why = 'key'), '{}'),
               coalesce(array_agg(t.id) FILTER (WHERE t.why = 'rate'), '{}'),
               (SELECT array_agg(DISTINCT b.concurrency_key) FROM b WHERE b.behind)
        INTO p_key, p_rate, p_behind
        FROM todo t;
        -- By primary key (`= ANY`): joined to a set, a generic plan may hash
        -- the whole table.
        UPDATE instances i SET parked = 'key' WHERE i.id = ANY (p_key);
        UPDATE instances i SET parked = 'rate' WHERE i.id = ANY (p_rate);
        -- How many, for the node's metrics: added to a setting local to the
        -- transaction, which the statement calling handoff reads at its end
        -- (sql/queries/handoff.sql) after every pick of the call.
        GET DIAGNOSTICS n_rate = ROW_COUNT;
        IF n_rate > 0 THEN
            PERFORM set_config('gendurable.rate_parked',
                               (coalesce(nullif(current_setting('gendurable.rate_parked', true), '')::bigint, 0)
                                + n_rate)::text, true);
        END IF;
        -- A key whose rows waited behind its parked ones has them all parked
        -- now: its head comes back, in key order, into the room it has.
        IF p_behind IS NOT NULL THEN
            PERFORM unpark_keys(p_behind, gate_names, gate_limits, NULL);
        END IF;
    END IF;
END
$$;
