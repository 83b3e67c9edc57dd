-- Claim tokens: the fence of every write a node makes about a row it holds.
--
-- Outcomes were fenced by (status, node, attempt), but `attempt` goes back to
-- 0 at every new step, so the same (node, attempt) pair recurs: an outcome
-- replayed after its call committed without an answer (a cut connection)
-- applied to a later claim of the same row by the same node. `token` is
-- bumped by every claim, reservation, handover and promotion of a row and
-- never goes back, so a write naming a token applies to that claim and no
-- other. An outcome also names the key and gate shard its claim holds and
-- applies only while the row holds exactly those, so what it frees and
-- credits is the row's own, never something else the caller sent.
--
-- pick() is restated from 20261130000005 with only its claim changed (the
-- token bumped and returned); handoff() from 20261130000003, see below.

ALTER TABLE instances ADD COLUMN token bigint NOT NULL DEFAULT 0;
ALTER TYPE claim ADD ATTRIBUTE token bigint;

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
            gate_shard = c.shard, token = i.token + 1
        FROM (SELECT array_agg(c.id) AS id, array_agg(c.attempt) AS attempt, array_agg(a.shard) AS shard
              FROM chosen c LEFT JOIN gassign a ON a.id = c.id) agg
        CROSS JOIN LATERAL unnest(agg.id, agg.attempt, agg.shard) AS c(id, attempt, shard)
        WHERE i.id = c.id
        RETURNING i.id, i.workflow, i.step, i.state, i.queue, i.priority, i.attempt, i.max_attempts,
                  i.concurrency_key, i.gate_shard, i.rate_key, i.wake, i.token, i.scheduled_at
    )
    -- In pick order: the node starts the rows in the order they come back.
    SELECT id, workflow, step, state, queue, priority, attempt, max_attempts, concurrency_key,
           gate_shard, rate_key, wake, token
    FROM claimed
    ORDER BY priority, scheduled_at, id;
END
$$;
-- Give reserved rows back to everyone: rows of `ids` reserved by `node_id`
-- under the matching `tokens` (a reservation given back late leaves a newer
-- one alone), or all of the node's when `ids` is NULL. A cancel that arrived
-- meanwhile takes effect. Returns how many rows it released.
DROP FUNCTION release_reserved(text, bigint[]);
CREATE FUNCTION release_reserved(node_id text, ids bigint[], tokens bigint[]) RETURNS integer
LANGUAGE sql VOLATILE
SET search_path FROM CURRENT
SET jit = off
AS $$
    WITH r AS (
        UPDATE instances i SET
            node = NULL,
            status = CASE WHEN i.cancel_requested THEN 'cancelled' ELSE 'available' END,
            finished_at = CASE WHEN i.cancel_requested THEN now() END
        WHERE i.status = 'available' AND i.node = node_id
          AND (ids IS NULL
               OR (i.id, i.token) IN (SELECT * FROM unnest(ids, tokens)))
        RETURNING 1
    )
    SELECT count(*)::integer FROM r
$$;

-- Outcomes, promotions, handovers, claims and reservations in one call (one
-- round trip, one commit); the parameters are those of 20261130000002.
--
-- An outcome (see OutcomeRow) applies only while its row is executing on
-- this node under its token and still holds the key and shard the outcome
-- names; `next`/`ntoken` name the reserved successor the node started in the
-- slot it frees and that reservation's token. A successor is promoted only
-- if its predecessor's outcome applied in this call. The header row lists in
-- `promoted` every successor named in the call that runs under this node now
-- (promoted here, or by an earlier call whose answer was lost): a successor
-- not listed was not admitted, and its node must not let it finish.
-- `unreserve`/`unreserve_tokens`: reservations the node gives back.
DROP FUNCTION handoff(jsonb, text, text, boolean, text[], integer[], boolean[], boolean[], bigint[],
                      float8, text[], text[], integer[], integer[], text[], float8[], float8[]);

CREATE FUNCTION handoff(outcomes jsonb, node_id text, channel text, notify boolean,
                        queues text[], demands integer[], skip_pick boolean[], reserve boolean[],
                        unreserve bigint[], unreserve_tokens bigint[], win_factor float8, workflows text[],
                        gate_names text[], gate_limits integer[], gate_shards integer[],
                        rate_names text[], rate_intervals float8[], rate_tolerances float8[])
RETURNS TABLE (claimed claim, reserved boolean, written integer, released integer,
               handed_over integer, released_keys text[], promoted bigint[])
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    n_written integer := 0;
    n_unreserved integer := 0;
    -- The freed keys still free at the end.
    r_key text[] := '{}';
    -- What the applied outcomes freed: the key each claim held, its gate shard
    -- (NULL for K = 1), queue, and the successor started in its place.
    f_key text[];
    f_shard integer[];
    f_queue text[];
    f_next bigint[];
    f_ntoken bigint[];
    -- Successors promoted into freed slots, and every named successor that
    -- runs here now.
    t_key text[];
    t_shard integer[];
    p_id bigint[] := '{}';
    -- Every successor the outcomes name, with its reservation's token.
    n_next bigint[];
    n_ntoken bigint[];
    -- Keyed rows that want a successor reserved.
    w_key text[];
    w_queue text[];
    -- Rows the freed keys and slots were handed over to.
    h_id bigint[];
    h_queue text[];
    d integer;
    q integer;
BEGIN
    IF jsonb_array_length(outcomes) > 0 THEN
        WITH o AS (
            SELECT * FROM jsonb_to_recordset(outcomes) AS o(
                id bigint, token bigint, kind text, status text, step text, state jsonb,
                set_key boolean, ckey text, rkey text, delay float8, until timestamptz,
                signal text, error jsonb, hkey text, gshard integer, next bigint, ntoken bigint)
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
            WHERE i.id = o.id AND i.status = 'executing' AND i.node = node_id AND i.token = o.token
              AND i.concurrency_key IS NOT DISTINCT FROM o.hkey
              AND i.gate_shard IS NOT DISTINCT FROM o.gshard
            RETURNING i.queue, o.hkey, o.gshard, o.next, o.ntoken
        )
        SELECT count(*)::integer,
               array_agg(u.hkey) FILTER (WHERE u.hkey IS NOT NULL),
               array_agg(u.gshard) FILTER (WHERE u.hkey IS NOT NULL),
               array_agg(u.queue) FILTER (WHERE u.hkey IS NOT NULL),
               array_agg(u.next) FILTER (WHERE u.hkey IS NOT NULL),
               array_agg(u.ntoken) FILTER (WHERE u.hkey IS NOT NULL),
               (SELECT array_agg(o.next) FROM o WHERE o.next IS NOT NULL),
               (SELECT array_agg(o.ntoken) FROM o WHERE o.next IS NOT NULL)
        INTO n_written, f_key, f_shard, f_queue, f_next, f_ntoken, n_next, n_ntoken
        FROM upd u;
    END IF;

    -- Promote the successors started in freed slots: each takes its
    -- predecessor's shard (same key, same queue, so no counter changes). The
    -- predecessor left 'executing' in the statement above, so the K = 1 index
    -- sees one executing row per key throughout.
    IF f_next IS NOT NULL THEN
        WITH p AS (
            SELECT p.* FROM unnest(f_next, f_ntoken, f_shard, f_key, f_queue) AS p(id, ntoken, shard, key, queue)
            WHERE p.id IS NOT NULL
        ), moved AS (
            UPDATE instances i
            SET status = 'executing', attempt = i.attempt + 1, attempted_at = now(), gate_shard = p.shard,
                token = i.token + 1
            FROM p
            WHERE i.id = p.id AND i.status = 'available' AND i.node = node_id AND i.token = p.ntoken
              AND i.concurrency_key = p.key AND i.queue = p.queue
            RETURNING i.concurrency_key, i.gate_shard
        )
        SELECT array_agg(concurrency_key), array_agg(gate_shard)
        INTO t_key, t_shard
        FROM moved;
    END IF;

    -- Every successor the outcomes name that runs here under the token its
    -- promotion gives: promoted just now, or by a call whose answer was lost
    -- (its predecessor's outcome is fenced on the retry).
    IF n_next IS NOT NULL THEN
        SELECT coalesce(array_agg(i.id), '{}') INTO p_id
        FROM unnest(n_next, n_ntoken) AS n(id, ntoken)
        JOIN instances i ON i.id = n.id
        WHERE i.status = 'executing' AND i.node = node_id AND i.token = n.ntoken + 1;
    END IF;

    -- Hand the keys and slots no successor took over to the next rows of the
    -- same keys in the same queues, as far as the caller's demand goes: the
    -- node has room, and these rows can run now (their key was just held).
    -- Reaching a key's rows through its own index entries costs the same
    -- however deep the backlog. Rows under a configured rate limit are left
    -- to the pick. A handed-over row takes the freed gate shard, so no
    -- counter changes. A K = 1 key needs no claim_key here: the row that
    -- held it leaves 'executing' in this same transaction, so no other
    -- picker ever sees the key free. The pick gets the demand left.
    IF f_key IS NOT NULL THEN
        WITH slot AS (
            SELECT f.key, f.shard, f.queue, count(*)::integer AS n
            FROM unnest(f_key, f_shard, f_queue, f_next) AS f(key, shard, queue, next)
            WHERE f.next IS NULL AND demands[array_position(queues, f.queue)] > 0
            GROUP BY 1, 2, 3
        ), cand AS MATERIALIZED (
            SELECT s.key, s.shard, s.queue, c.id, c.priority, c.scheduled_at
            FROM slot s CROSS JOIN LATERAL (
                SELECT i.id, i.priority, i.scheduled_at FROM instances i
                WHERE i.concurrency_key = s.key AND i.queue || '' = s.queue AND i.status = 'available'
                  AND i.node IS NULL AND i.workflow = ANY (workflows)
                  AND (i.rate_key IS NULL
                       OR array_position(rate_names, split_part(i.rate_key, ':', 1)) IS NULL)
                ORDER BY i.priority, i.scheduled_at, i.id
                LIMIT s.n
                FOR UPDATE SKIP LOCKED) c
        ), chosen AS MATERIALIZED (
            SELECT c.id, c.shard FROM (
                SELECT c.*, row_number() OVER (PARTITION BY c.queue
                                               ORDER BY c.priority, c.scheduled_at, c.id) AS qn
                FROM cand c) c
            WHERE c.qn <= demands[array_position(queues, c.queue)]
        ), handed AS (
            UPDATE instances i
            SET status = 'executing', node = node_id, attempt = i.attempt + 1, attempted_at = now(),
                gate_shard = c.shard, token = i.token + 1
            FROM chosen c
            WHERE i.id = c.id
            RETURNING i.id, i.queue, i.concurrency_key, i.gate_shard
        )
        SELECT array_agg(id), array_agg(queue), coalesce(t_key, '{}') || array_agg(concurrency_key),
               coalesce(t_shard, '{}') || array_agg(gate_shard)
        INTO h_id, h_queue, t_key, t_shard
        FROM handed;
    END IF;

    IF cardinality(unreserve) > 0 THEN
        n_unreserved := release_reserved(node_id, unreserve, unreserve_tokens);
    END IF;

    -- Credit the gate slots nobody took over, each to the shard it came
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

    IF h_id IS NOT NULL THEN
        RETURN QUERY
        SELECT (i.id, i.workflow, i.step, i.state, i.queue, i.priority, i.attempt, i.max_attempts,
                i.concurrency_key, i.gate_shard, i.rate_key, i.wake, i.token)::claim, false, NULL::integer,
               NULL::integer, NULL::integer, NULL::text[], NULL::bigint[]
        FROM instances i WHERE i.id = ANY (h_id);
    END IF;

    -- Claim for the demand, queue by queue.
    FOR q IN 1 .. coalesce(cardinality(queues), 0) LOOP
        -- What the handover left of the demand.
        d := demands[q] - coalesce(cardinality(array_positions(h_queue, queues[q])), 0);
        IF d > 0 AND NOT skip_pick[q] THEN
            RETURN QUERY
            SELECT p, false, NULL::integer, NULL::integer, NULL::integer, NULL::text[], NULL::bigint[]
            FROM pick(queues[q], d, ceil(d * win_factor)::integer + 8,
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
                WHERE i.concurrency_key = w.key AND i.queue || '' = w.queue AND i.status = 'available'
                  AND i.node IS NULL AND i.workflow = ANY (workflows)
                  AND (i.rate_key IS NULL
                       OR array_position(rate_names, split_part(i.rate_key, ':', 1)) IS NULL)
                ORDER BY i.priority, i.scheduled_at, i.id
                LIMIT w.n
                FOR UPDATE SKIP LOCKED) n
        )
        UPDATE instances i SET node = node_id, token = i.token + 1
        FROM nxt
        WHERE i.id = nxt.id
        RETURNING (i.id, i.workflow, i.step, i.state, i.queue, i.priority, i.attempt, i.max_attempts,
                   i.concurrency_key, i.gate_shard, i.rate_key, i.wake, i.token)::claim, true, NULL::integer,
                  NULL::integer, NULL::integer, NULL::text[], NULL::bigint[];
    END IF;

    -- The keys the outcomes freed that are still free now that this call has
    -- handed over and claimed: rows waiting for them may sit in any queue, on
    -- any node, so wake the other nodes ('*' and the sender), and tell the
    -- caller (which gives back its reservations of those keys). Only when
    -- other nodes are alive (a lone node claims for itself; one that starts
    -- meanwhile polls until our next heartbeat sees it).
    IF f_key IS NOT NULL THEN
        SELECT coalesce(array_agg(f.key), '{}') INTO r_key
        FROM (SELECT DISTINCT f.key, f.shard IS NULL AS k1 FROM unnest(f_key, f_shard) AS f(key, shard)) f
        WHERE CASE WHEN f.k1
                   THEN NOT EXISTS (SELECT 1 FROM instances e
                                    WHERE e.status = 'executing' AND e.gate_shard IS NULL
                                      AND e.concurrency_key = f.key)
                   ELSE EXISTS (SELECT 1 FROM gate_slots s WHERE s.key = f.key AND s.available > 0)
              END;
    END IF;
    IF notify AND cardinality(r_key) + n_unreserved > 0 THEN
        PERFORM pg_notify(channel, '*' || node_id);
    END IF;
    RETURN QUERY SELECT NULL::claim, NULL::boolean, n_written, cardinality(r_key) + n_unreserved,
                        coalesce(cardinality(h_id), 0), r_key, p_id;
END
$$;

-- The gate reconciler, bounded: at most `lim` counters per sweep, from the
-- first key after `after` (NULL: from the start), so a sweep over many keys
-- never holds a connection long. Returns the counters changed and the last
-- key swept (NULL once it reached the end: the next sweep starts over).
-- Otherwise as in 20261130000001.
DROP FUNCTION reconcile_gates();
CREATE FUNCTION reconcile_gates(after text, lim integer, OUT changed integer, OUT last_key text)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET jit = off
AS $$
DECLARE
    lk text[];
    ls integer[];
    n_seen integer;
BEGIN
    -- Whole keys only: a key's shards are swept together.
    WITH k AS (
        SELECT DISTINCT key FROM gate_slots
        WHERE after IS NULL OR key > after
        ORDER BY key
        LIMIT lim
    ), l AS (
        SELECT g.key, g.shard FROM gate_slots g
        WHERE g.key IN (SELECT key FROM k)
        ORDER BY g.key, g.shard
        FOR UPDATE SKIP LOCKED
    )
    SELECT array_agg(l.key), array_agg(l.shard), (SELECT count(*) FROM k), (SELECT max(key) FROM k)
    INTO lk, ls, n_seen, last_key FROM l;
    IF n_seen < lim THEN
        last_key := NULL;
    END IF;
    changed := 0;
    IF lk IS NULL THEN
        RETURN;
    END IF;

    -- A new statement: a fresh snapshot, taken after the locks.
    WITH mine AS (
        SELECT * FROM unnest(lk, ls) AS m(key, shard)
    ), truth AS (
        SELECT g.key, g.shard, g.capacity,
               greatest(g.capacity - (SELECT count(*) FROM instances i
                                      WHERE i.status = 'executing' AND i.concurrency_key = g.key
                                        AND i.gate_shard = g.shard), 0)::integer AS should
        FROM gate_slots g JOIN mine USING (key, shard)
    ), idle AS (
        SELECT g.key FROM gate_slots g LEFT JOIN truth t USING (key, shard)
        WHERE g.key IN (SELECT key FROM mine)
        GROUP BY g.key
        HAVING bool_and(t.should IS NOT NULL AND t.should = t.capacity)
    ), del AS (
        DELETE FROM gate_slots g USING idle WHERE g.key = idle.key RETURNING 1
    ), fix AS (
        UPDATE gate_slots g SET available = t.should
        FROM truth t
        WHERE g.key = t.key AND g.shard = t.shard AND g.available <> t.should
          AND t.key NOT IN (SELECT key FROM idle)
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM del) + (SELECT count(*) FROM fix) INTO changed;
END
$$;
