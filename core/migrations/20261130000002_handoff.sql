-- The claim path as functions, so that one call does what used to take a
-- transaction of several round trips: record a batch of outcomes, hand the
-- keys and gate slots they free to the reserved successors the node already
-- started, credit what is left, claim for the node's free slots and reserve
-- the next successors.
--
-- A reserved row stays 'available' with `node` set: nobody else claims it and
-- it holds no key or slot. When a step that holds a key ends, its node starts
-- the key's reserved successor at once in the freed slot (no round trip in
-- between) and records both in one call: the finished row's outcome and the
-- successor's promotion to 'executing' in the same gate shard, so the slot
-- moves from one row to the next and the counters never change. A cancel of a
-- reserved row is treated like one of an executing row (it may already run).

CREATE TYPE claim AS (
    id              bigint,
    workflow        text,
    step            text,
    state           jsonb,
    queue           text,
    priority        smallint,
    attempt         integer,
    max_attempts    integer,
    concurrency_key text,
    gate_shard      integer,
    rate_key        text,
    wake            jsonb
);

-- The next runnable rows of a key, for reserving successors.
CREATE INDEX instances_key_next ON instances (concurrency_key, queue, priority, scheduled_at, id)
    WHERE status = 'available' AND concurrency_key IS NOT NULL;

-- Reserved rows by node, for the reaper and a stopping node.
CREATE INDEX instances_reserved ON instances (node) WHERE status = 'available' AND node IS NOT NULL;

-- Give reserved rows back to everyone: rows of `ids` (or all of the node's when
-- NULL) reserved by `node_id`. A cancel that arrived meanwhile takes effect.
-- Returns how many rows it released.
CREATE FUNCTION release_reserved(node_id text, ids bigint[]) RETURNS integer
LANGUAGE sql VOLATILE
SET search_path FROM CURRENT
AS $$
    WITH r AS (
        UPDATE instances i SET
            node = NULL,
            status = CASE WHEN i.cancel_requested THEN 'cancelled' ELSE 'available' END,
            finished_at = CASE WHEN i.cancel_requested THEN now() END
        WHERE i.status = 'available' AND i.node = node_id AND (ids IS NULL OR i.id = ANY (ids))
        RETURNING 1
    )
    SELECT count(*)::integer FROM r
$$;

-- The pick: claim up to $2 runnable rows of queue $1 for node $5, admitting
-- each through its K = 1 key, its gate and its rate limit, in one statement.
--
-- $1 queue, $2 demand, $3 window, $4 workflows this node runs, $5 node id,
-- $6/$7/$8 gate names/limits/shards, $9/$10/$11 rate-limit names/GCRA
-- interval/GCRA tolerance (seconds). gi and ri index those arrays.
--
-- Phases: (1) a window of candidates, keeping out rows that cannot be admitted
-- now (executing K = 1 key, saturated gate, exhausted rate limit); (2) lock the
-- counters the window needs (SKIP LOCKED: pickers take disjoint shards) and
-- decide which fresh keys this pick mints; (3) choose rows that pass every
-- limit; (4) write: mint and debit exactly for the chosen rows, then claim.
-- A row one limit rejects debits no other limit.
CREATE FUNCTION pick(text, integer, integer, text[], text, text[], integer[], integer[],
                     text[], float8[], float8[])
RETURNS SETOF claim
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
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
    )
    UPDATE instances i
    SET status = 'executing', node = $5, attempt = c.attempt + 1, attempted_at = now(), gate_shard = a.shard
    FROM chosen c LEFT JOIN gassign a ON a.id = c.id
    WHERE i.id = c.id
    RETURNING i.id, i.workflow, i.step, i.state, i.queue, i.priority, i.attempt, i.max_attempts,
              i.concurrency_key, i.gate_shard, i.rate_key, i.wake;
END
$$;

-- Outcomes, handovers and claims in one call (one round trip, one commit).
--
-- outcomes: a JSON array of outcomes (see OutcomeRow); each applies only while
-- its row is still executing under the same claim (node and attempt), so a
-- late outcome of a rescued row is dropped; `next` names the reserved
-- successor the node started in the freed slot. queues/demands: how many rows
-- to claim per queue (empty: record the outcomes only); `skip_pick` set: the
-- caller knows a pick would find nothing new; `reserve` set: reserve a
-- successor for each keyed row claimed or promoted in that queue (the node has
-- room its keys cannot fill, so slots should hand over without a round trip).
-- unreserve: reserved rows the node no longer wants. The remaining parameters
-- are the pick's. Returns the claimed rows (reserved = false), the reserved
-- ones (reserved = true), and one row with only `written` (outcomes applied)
-- and `released` (freed keys and slots nobody took over) set.
CREATE FUNCTION handoff(outcomes jsonb, node_id text, channel text, notify boolean,
                        queues text[], demands integer[], skip_pick boolean[], reserve boolean[],
                        unreserve bigint[], win_factor float8, workflows text[],
                        gate_names text[], gate_limits integer[], gate_shards integer[],
                        rate_names text[], rate_intervals float8[], rate_tolerances float8[])
RETURNS TABLE (claimed claim, reserved boolean, written integer, released integer)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    n_written integer := 0;
    n_unreserved integer := 0;
    -- What the applied outcomes freed: the key each claim held, its gate shard
    -- (NULL for K = 1), queue, and the successor started in its place.
    f_key text[];
    f_shard integer[];
    f_queue text[];
    f_next bigint[];
    -- Successors promoted into freed slots.
    t_key text[];
    t_shard integer[];
    -- Keyed rows that want a successor reserved.
    w_key text[];
    w_queue text[];
    q integer;
BEGIN
    IF jsonb_array_length(outcomes) > 0 THEN
        WITH o AS (
            SELECT * FROM jsonb_to_recordset(outcomes) AS o(
                id bigint, attempt integer, kind text, status text, step text, state jsonb,
                set_key boolean, ckey text, rkey text, delay float8, until timestamptz,
                signal text, error jsonb, hkey text, gshard integer, next bigint)
        ), upd AS (
            UPDATE instances i SET
                status = CASE WHEN i.cancel_requested AND o.status NOT IN ('completed', 'cancelled', 'discarded')
                              THEN 'cancelled' ELSE o.status END,
                step = coalesce(o.step, i.step),
                state = coalesce(o.state, i.state),
                concurrency_key = CASE WHEN o.set_key THEN o.ckey ELSE i.concurrency_key END,
                rate_key = CASE WHEN o.kind IN ('snooze', 'error', 'release') THEN i.rate_key ELSE o.rkey END,
                attempt = CASE o.kind WHEN 'error' THEN i.attempt
                                      WHEN 'snooze' THEN i.attempt - 1
                                      WHEN 'release' THEN i.attempt - 1
                                      ELSE 0 END,
                -- The wake stays visible to a retry of the same step.
                wake = CASE WHEN o.kind IN ('snooze', 'error', 'release') THEN i.wake END,
                scheduled_at = CASE WHEN o.status = 'scheduled' THEN now() + make_interval(secs => o.delay)
                                    ELSE now() END,
                await_signal = o.signal,
                await_until = CASE WHEN o.status = 'awaiting'
                                   THEN least(o.until, now() + make_interval(secs => o.delay)) END,
                errors = CASE WHEN o.error IS NULL THEN i.errors
                              ELSE i.errors || jsonb_build_array(o.error || jsonb_build_object('at', now())) END,
                finished_at = CASE WHEN o.status IN ('completed', 'cancelled', 'discarded')
                                     OR (i.cancel_requested AND o.status NOT IN ('completed'))
                                   THEN now() END,
                node = NULL,
                gate_shard = NULL
            FROM o
            WHERE i.id = o.id AND i.status = 'executing' AND i.node = node_id AND i.attempt = o.attempt
            RETURNING i.queue, o.hkey, o.gshard, o.next
        )
        SELECT count(*)::integer,
               array_agg(u.hkey) FILTER (WHERE u.hkey IS NOT NULL),
               array_agg(u.gshard) FILTER (WHERE u.hkey IS NOT NULL),
               array_agg(u.queue) FILTER (WHERE u.hkey IS NOT NULL),
               array_agg(u.next) FILTER (WHERE u.hkey IS NOT NULL)
        INTO n_written, f_key, f_shard, f_queue, f_next
        FROM upd u;
    END IF;

    -- Promote the successors started in freed slots: each takes its
    -- predecessor's shard (its key is the same), so no counter changes. The
    -- predecessor left 'executing' in the statement above, so the K = 1 index
    -- sees one executing row per key throughout.
    IF f_next IS NOT NULL THEN
        WITH p AS (
            SELECT p.id, p.shard FROM unnest(f_next, f_shard) AS p(id, shard) WHERE p.id IS NOT NULL
        ), promoted AS (
            UPDATE instances i
            SET status = 'executing', attempt = i.attempt + 1, attempted_at = now(), gate_shard = p.shard
            FROM p
            WHERE i.id = p.id AND i.status = 'available' AND i.node = node_id
            RETURNING i.concurrency_key, i.gate_shard
        )
        SELECT array_agg(concurrency_key), array_agg(gate_shard)
        INTO t_key, t_shard
        FROM promoted;
    END IF;

    IF cardinality(unreserve) > 0 THEN
        n_unreserved := release_reserved(node_id, unreserve);
    END IF;

    -- Credit the gate slots no successor took over, each to the shard it came
    -- from, locking the counters in key order. Values come from the locked
    -- version (see the pick); least(): never above capacity.
    IF f_key IS NOT NULL THEN
        WITH freed AS (
            SELECT key, shard, count(*)::integer AS n FROM unnest(f_key, f_shard) AS f(key, shard)
            WHERE shard IS NOT NULL GROUP BY 1, 2
        ), taken AS (
            SELECT key, shard, count(*)::integer AS n FROM unnest(t_key, t_shard) AS t(key, shard)
            WHERE shard IS NOT NULL GROUP BY 1, 2
        ), credit AS (
            SELECT f.key, f.shard, f.n - coalesce(t.n, 0) AS n
            FROM freed f LEFT JOIN taken t ON t.key = f.key AND t.shard = f.shard
            WHERE f.n > coalesce(t.n, 0)
        ), locked AS (
            SELECT g.key, g.shard, g.available, g.capacity, c.n FROM gate_slots g
            JOIN credit c ON c.key = g.key AND c.shard = g.shard
            ORDER BY g.key, g.shard
            FOR UPDATE OF g
        )
        UPDATE gate_slots g SET available = least(l.available + l.n, l.capacity)
        FROM locked l
        WHERE g.key = l.key AND g.shard = l.shard;
    END IF;

    -- Rows waiting for a key or slot that was released (not handed over), or
    -- for a row given back, may sit in any queue, on any node: wake the other
    -- nodes ('*' and the sender). Only when other nodes are alive (a lone node
    -- claims for itself; one that starts meanwhile polls until our next
    -- heartbeat sees it).
    IF notify AND (coalesce(cardinality(f_key), 0) > coalesce(cardinality(t_key), 0)
                   OR n_unreserved > 0) THEN
        PERFORM pg_notify(channel, '*' || node_id);
    END IF;
    RETURN QUERY SELECT NULL::claim, NULL::boolean, n_written,
                        coalesce(cardinality(f_key), 0) - coalesce(cardinality(t_key), 0) + n_unreserved;

    -- Claim for the demand, queue by queue.
    FOR q IN 1 .. coalesce(cardinality(queues), 0) LOOP
        IF demands[q] > 0 AND NOT skip_pick[q] THEN
            RETURN QUERY
            SELECT p, false, NULL::integer, NULL::integer
            FROM pick(queues[q], demands[q], ceil(demands[q] * win_factor)::integer + 8,
                      workflows, node_id, gate_names, gate_limits, gate_shards,
                      rate_names, rate_intervals, rate_tolerances) p;
        END IF;
    END LOOP;

    -- The keyed rows claimed or promoted just now (this transaction's
    -- timestamp) in queues that reserve.
    IF true = ANY (reserve) THEN
        SELECT coalesce(array_agg(i.concurrency_key), '{}'), coalesce(array_agg(i.queue), '{}')
        INTO w_key, w_queue
        FROM instances i
        WHERE i.status = 'executing' AND i.node = node_id AND i.attempted_at = now()
          AND i.concurrency_key IS NOT NULL AND reserve[array_position(queues, i.queue)]
          AND (i.rate_key IS NULL
               OR array_position(rate_names, split_part(i.rate_key, ':', 1)) IS NULL);
    END IF;

    -- Reserve a successor per keyed row that wants one: the next runnable rows
    -- of its key and queue nobody holds. Only for keys that are full (K = 1,
    -- or a gate with no slot left): a row a free slot could admit now is left
    -- to the pick. Rows under a configured rate limit are left to the pick,
    -- which checks the limit.
    IF cardinality(w_key) > 0 THEN
        RETURN QUERY
        WITH w AS (
            SELECT k.key, k.queue, count(*)::integer AS n
            FROM unnest(w_key, w_queue) AS k(key, queue)
            WHERE NOT EXISTS (SELECT 1 FROM gate_slots s WHERE s.key = k.key AND s.available > 0)
            GROUP BY 1, 2
        ), nxt AS (
            SELECT n.id FROM w CROSS JOIN LATERAL (
                SELECT i.id FROM instances i
                WHERE i.concurrency_key = w.key AND i.queue = w.queue AND i.status = 'available'
                  AND i.node IS NULL AND i.workflow = ANY (workflows)
                  AND (i.rate_key IS NULL
                       OR array_position(rate_names, split_part(i.rate_key, ':', 1)) IS NULL)
                ORDER BY i.priority, i.scheduled_at, i.id
                LIMIT w.n
                FOR UPDATE SKIP LOCKED) n
        )
        UPDATE instances i SET node = node_id
        FROM nxt
        WHERE i.id = nxt.id
        RETURNING (i.id, i.workflow, i.step, i.state, i.queue, i.priority, i.attempt, i.max_attempts,
                   i.concurrency_key, i.gate_shard, i.rate_key, i.wake)::claim, true, NULL::integer,
                  NULL::integer;
    END IF;
END
$$;
