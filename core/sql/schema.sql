CREATE SCHEMA gendurable;

CREATE TYPE gendurable.claim AS (
	id bigint,
	workflow text,
	step text,
	state jsonb,
	queue text,
	priority smallint,
	attempt integer,
	max_attempts integer,
	concurrency_key text,
	gate_shard integer,
	rate_key text,
	wake jsonb,
	token bigint
);

CREATE FUNCTION gendurable.claim_key(k text) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'gendurable'
    AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext(current_schema() || ':k1'), hashtext(k)) THEN
        RETURN false;
    END IF;
    RETURN NOT EXISTS (
        SELECT 1 FROM instances
        WHERE status = 'executing' AND concurrency_key = k AND gate_shard IS NULL);
END
$$;

CREATE FUNCTION gendurable.handoff(outcomes jsonb, node_id text, channel text, notify boolean, queues text[], demands integer[], skip_pick boolean[], reserve boolean[], unreserve bigint[], unreserve_tokens bigint[], win_factor double precision, workflows text[], gate_names text[], gate_limits integer[], gate_shards integer[], rate_names text[], rate_intervals double precision[], rate_tolerances double precision[]) RETURNS TABLE(claimed gendurable.claim, reserved boolean, written integer, released integer, handed_over integer, released_keys text[], promoted bigint[])
    LANGUAGE plpgsql
    SET search_path TO 'gendurable'
    SET plan_cache_mode TO 'force_generic_plan'
    SET jit TO 'off'
    AS $$
#variable_conflict use_column
DECLARE
    n_written integer := 0;
    n_unreserved integer := 0;
    n_unparked integer := 0;
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
    -- Every row this call claimed, promoted or handed over.
    c_id bigint[] := '{}';
    picked claim[];
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
            RETURNING i.id, i.concurrency_key, i.gate_shard
        )
        SELECT coalesce(array_agg(id), '{}'), array_agg(concurrency_key), array_agg(gate_shard)
        INTO p_id, t_key, t_shard
        FROM moved;
        c_id := p_id;
    END IF;

    -- Every successor the outcomes name that runs here under the token its
    -- promotion gives: promoted just now, or by a call whose answer was lost
    -- (its predecessor's outcome is fenced on the retry). Only needed when
    -- some were not promoted just now.
    IF cardinality(n_next) > cardinality(p_id) THEN
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
    IF array_position(f_next, NULL) IS NOT NULL THEN
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
                gate_shard = c.shard, token = i.token + 1, parked = NULL
            FROM chosen c
            WHERE i.id = c.id
            RETURNING i.id, i.queue, i.concurrency_key, i.gate_shard
        )
        SELECT array_agg(id), array_agg(queue), coalesce(t_key, '{}') || array_agg(concurrency_key),
               coalesce(t_shard, '{}') || array_agg(gate_shard)
        INTO h_id, h_queue, t_key, t_shard
        FROM handed;
        c_id := c_id || coalesce(h_id, '{}');
    END IF;

    IF cardinality(unreserve) > 0 THEN
        n_unreserved := release_reserved(node_id, unreserve, unreserve_tokens);
    END IF;

    -- Credit the gate slots nobody took over, each to the shard it came
    -- from, locking the counters in key order. Values come from the locked
    -- version (see the pick); least(): never above capacity. Each row taken
    -- over took one freed slot, so with as many taken as freed none is left.
    IF coalesce(cardinality(t_key), 0) < cardinality(f_key) THEN
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
            -- In pick order (a function scan keeps it).
            SELECT coalesce(array_agg(p), '{}') INTO picked
            FROM pick(queues[q], d, ceil(d * win_factor)::integer + 8,
                      workflows, node_id, gate_names, gate_limits, gate_shards,
                      rate_names, rate_intervals, rate_tolerances) p;
            RETURN QUERY
            SELECT p, false, NULL::integer, NULL::integer, NULL::integer, NULL::text[], NULL::bigint[]
            FROM unnest(picked) p;
            c_id := c_id || ARRAY(SELECT (p).id FROM unnest(picked) p);
        END IF;
    END LOOP;

    -- The keyed rows claimed or promoted just now in queues that reserve,
    -- by id: the executing index holds an entry for every row this node ran
    -- since the last vacuum.
    IF true = ANY (reserve) AND cardinality(c_id) > 0 THEN
        SELECT coalesce(array_agg(i.concurrency_key), '{}'), coalesce(array_agg(i.queue), '{}')
        INTO w_key, w_queue
        FROM instances i
        WHERE i.id = ANY (c_id) AND i.status = 'executing' AND i.node = node_id
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
        UPDATE instances i SET node = node_id, token = i.token + 1, parked = NULL
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
    -- meanwhile polls until our next heartbeat sees it). A key whose every
    -- freed slot was taken over is as full as before.
    IF coalesce(cardinality(t_key), 0) < cardinality(f_key) THEN
        SELECT coalesce(array_agg(f.key), '{}') INTO r_key
        FROM (SELECT DISTINCT f.key, f.shard IS NULL AS k1 FROM unnest(f_key, f_shard) AS f(key, shard)) f
        WHERE CASE WHEN f.k1
                   THEN NOT EXISTS (SELECT 1 FROM instances e
                                    WHERE e.status = 'executing' AND e.gate_shard IS NULL
                                      AND e.concurrency_key = f.key)
                   ELSE EXISTS (SELECT 1 FROM gate_slots s WHERE s.key = f.key AND s.available > 0)
              END;
    END IF;
    -- Their parked rows come into the room they have now.
    IF cardinality(r_key) > 0 THEN
        n_unparked := unpark_keys(r_key, gate_names, gate_limits, NULL);
    END IF;
    IF notify AND cardinality(r_key) + n_unreserved > 0 THEN
        PERFORM pg_notify(channel, '*' || node_id);
    END IF;
    RETURN QUERY SELECT NULL::claim, NULL::boolean, n_written, cardinality(r_key) + n_unreserved,
                        coalesce(cardinality(h_id), 0), r_key, p_id;
END
$$;

CREATE FUNCTION gendurable.key_room(keys text[], gate_names text[], gate_limits integer[]) RETURNS TABLE(key text, room integer)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'gendurable'
    SET jit TO 'off'
    AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT k.key, greatest(k.cap
               - (SELECT count(*) FROM (SELECT 1 FROM instances e
                                         WHERE e.status = 'executing' AND e.gate_shard IS NULL
                                           AND e.concurrency_key = k.key LIMIT k.cap) x)
               - (SELECT count(*) FROM (SELECT 1 FROM instances e
                                         WHERE e.status = 'executing' AND e.gate_shard IS NOT NULL
                                           AND e.concurrency_key = k.key LIMIT k.cap) x)
               - (SELECT count(*) FROM (SELECT 1 FROM instances a
                                         WHERE a.status = 'available' AND a.parked IS NULL
                                           AND a.concurrency_key = k.key LIMIT k.cap) x), 0)::integer
    FROM (SELECT d.key, coalesce(gate_limits[array_position(gate_names, split_part(d.key, ':', 1))], 1) AS cap
          FROM (SELECT DISTINCT unnest(keys) AS key) d) k;
END
$$;

CREATE FUNCTION gendurable.may_mint_gate(k text) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'gendurable'
    AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext(current_schema() || ':gate'), hashtext(k)) THEN
        RETURN false;
    END IF;
    RETURN NOT EXISTS (SELECT 1 FROM gate_slots WHERE key = k);
END
$$;

CREATE FUNCTION gendurable.may_mint_rate(k text) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'gendurable'
    AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext(current_schema() || ':rate'), hashtext(k)) THEN
        RETURN false;
    END IF;
    RETURN NOT EXISTS (SELECT 1 FROM rate_state WHERE key = k);
END
$$;

CREATE FUNCTION gendurable.orphaned(q text, wf text, lease double precision) RETURNS boolean
    LANGUAGE plpgsql STABLE
    SET search_path TO 'gendurable'
    SET jit TO 'off'
    AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM nodes n
                   WHERE n.heartbeat_at > now() - make_interval(secs => lease) AND n.queues ? q)
       AND NOT EXISTS (SELECT 1 FROM nodes n
                       WHERE n.heartbeat_at > now() - make_interval(secs => lease) AND n.queues ? q
                         AND coalesce(n.workflows ? wf, true));
END
$$;

CREATE FUNCTION gendurable.park_orphans(q text, lease double precision, lim integer) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'gendurable'
    SET jit TO 'off'
    AS $$
DECLARE
    n integer;
BEGIN
    WITH head AS MATERIALIZED (
        SELECT i.id, i.workflow FROM instances i
        WHERE i.queue = q AND i.status = 'available' AND i.parked IS NULL AND i.node IS NULL
        ORDER BY i.priority, i.scheduled_at, i.id
        LIMIT lim
    ), workflows AS MATERIALIZED (
        -- Materialised: as a subquery, the planner pushes the orphaned() test
        -- below the DISTINCT and asks it once per row.
        SELECT DISTINCT workflow FROM head
    ), orphans AS MATERIALIZED (
        SELECT w.workflow FROM workflows w WHERE orphaned(q, w.workflow, lease)
    ), todo AS (
        -- Locked only once chosen; a row a pick holds is left to it. By
        -- primary key: with the status tests inside, a generic plan took the
        -- pick's index (whose predicate they match) and scanned it for the id.
        SELECT x.id
        FROM head h JOIN orphans o ON o.workflow = h.workflow
        CROSS JOIN LATERAL (SELECT y.id, y.status, y.parked, y.node FROM instances y
                            WHERE y.id = h.id
                            FOR UPDATE SKIP LOCKED) x
        WHERE x.status = 'available' AND x.parked IS NULL AND x.node IS NULL
    ), parked AS (
        UPDATE instances i SET parked = 'workflow' WHERE i.id = ANY (ARRAY(SELECT t.id FROM todo t)) RETURNING 1
    )
    SELECT count(*) INTO n FROM parked;
    RETURN n;
END
$$;

CREATE FUNCTION gendurable.pick(q text, demand integer, win_size integer, wfs text[], node_id text, gate_names text[], gate_limits integer[], gate_shards integer[], rate_names text[], rate_intervals double precision[], rate_tolerances double precision[]) RETURNS SETOF gendurable.claim
    LANGUAGE plpgsql
    SET search_path TO 'gendurable'
    SET plan_cache_mode TO 'force_generic_plan'
    SET jit TO 'off'
    AS $$
DECLARE
    -- The window, column by column.
    w_id bigint[];
    w_priority smallint[];
    w_at timestamptz[];
    w_key text[];
    w_rate text[];
    w_attempt integer[];
    limited boolean;
    -- Rows to park for their key and for their rate limit.
    p_key bigint[];
    p_rate bigint[];
    -- Keys whose rows waited behind their own parked rows.
    p_behind text[];
BEGIN
    -- (1) The window: the queue's next rows, locked. Parked rows are not in
    -- the index it walks.
    SELECT array_agg(w.id), array_agg(w.priority), array_agg(w.scheduled_at), array_agg(w.concurrency_key),
           array_agg(w.rate_key), array_agg(w.attempt),
           bool_or(w.concurrency_key IS NOT NULL OR w.rate_key IS NOT NULL)
    INTO w_id, w_priority, w_at, w_key, w_rate, w_attempt, limited
    FROM (SELECT i.id, i.priority, i.scheduled_at, i.concurrency_key, i.rate_key, i.attempt
          FROM instances i
          WHERE i.queue = q AND i.status = 'available' AND i.parked IS NULL AND i.node IS NULL
            AND i.workflow = ANY (wfs)
          ORDER BY i.priority, i.scheduled_at, i.id
          LIMIT win_size
          FOR UPDATE OF i SKIP LOCKED) w;
    IF w_id IS NULL THEN
        RETURN;
    END IF;

    -- (2) Admit and claim.
    RETURN QUERY
    WITH win AS MATERIALIZED (
        SELECT w.*,
               array_position(gate_names, split_part(w.ckey, ':', 1)) AS gi,
               array_position(rate_names, split_part(w.rkey, ':', 1)) AS ri
        FROM unnest(w_id, w_priority, w_at, w_key, w_rate, w_attempt)
             AS w(id, priority, scheduled_at, ckey, rkey, attempt)
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
        SELECT r.*, row_number() OVER (PARTITION BY r.rkey ORDER BY r.priority, r.scheduled_at, r.id) AS rrank
        FROM ranked r LEFT JOIN gcap g ON g.ckey = r.ckey
        WHERE r.ckey IS NULL
           OR (r.gi IS NULL AND r.krank = 1 AND NOT r.k1busy AND NOT r.behind)
           OR (r.gi IS NOT NULL AND r.krank <= g.cap AND NOT r.behind)
    ), chosen AS MATERIALIZED (
        SELECT c.id, c.priority, c.scheduled_at, c.ckey, c.gi, c.rkey, c.ri, c.attempt, a.fresh AS rfresh
        FROM cand c LEFT JOIN rallow a ON a.rkey = c.rkey
        WHERE (c.ri IS NULL OR c.rrank <= a.allowed)
          AND (c.ckey IS NULL OR c.gi IS NOT NULL OR claim_key(c.ckey))
        ORDER BY c.priority, c.scheduled_at, c.id
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
    ), claimed AS (
        UPDATE instances i
        SET status = 'executing', node = node_id, attempt = c.attempt + 1, attempted_at = now(),
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

    -- (3) Park the rows of the window that cannot run now, as a fresh
    -- snapshot sees them after this pick's claims and debits: a K = 1 key
    -- executing, a gate with no slot left, a rate limit with no start left.
    -- With them go the other rows of those keys still in the pick's index
    -- (up to 10,000 a key): a key without room has no rows waiting unparked.
    -- They stay out of the pick's index until unparked (see unpark_keys).
    IF limited THEN
        WITH b AS (
            SELECT x.id, x.concurrency_key, x.rate_key, x.behind,
                   CASE WHEN x.behind THEN 'key'
                        WHEN x.concurrency_key IS NOT NULL
                             AND CASE WHEN array_position(gate_names, split_part(x.concurrency_key, ':', 1)) IS NULL
                                      THEN EXISTS (SELECT 1 FROM instances e
                                                   WHERE e.status = 'executing' AND e.gate_shard IS NULL
                                                     AND e.concurrency_key = x.concurrency_key)
                                      ELSE (SELECT sum(s.available) FROM gate_slots s
                                            WHERE s.key = x.concurrency_key) = 0
                                 END
                        THEN 'key'
                        WHEN x.rate_key IS NOT NULL
                             AND EXISTS (SELECT 1 FROM rate_state rs
                                         WHERE rs.key = x.rate_key
                                           AND rs.tat > now() + make_interval(secs =>
                                               rate_tolerances[array_position(rate_names, split_part(x.rate_key, ':', 1))]))
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
                FROM unnest(w_id) AS u(id)
                CROSS JOIN LATERAL (SELECT * FROM instances i WHERE i.id = u.id OFFSET 0) y
                LEFT JOIN LATERAL (
                    SELECT p.priority, p.scheduled_at, p.id FROM instances p
                    WHERE p.concurrency_key = y.concurrency_key AND p.status = 'available'
                      AND p.parked = 'key' AND p.queue = q
                    ORDER BY p.priority, p.scheduled_at, p.id
                    LIMIT 1) f ON y.concurrency_key IS NOT NULL
                WHERE y.status = 'available' AND y.node IS NULL AND y.parked IS NULL) x
        ), more AS (
            SELECT m.id, 'key' AS why
            FROM (SELECT DISTINCT concurrency_key AS key FROM b WHERE why = 'key') k
            CROSS JOIN LATERAL (
                SELECT i.id FROM instances i
                WHERE i.concurrency_key = k.key AND i.status = 'available' AND i.parked IS NULL
                  AND i.node IS NULL
                LIMIT 10000
                FOR UPDATE SKIP LOCKED) m
            UNION
            SELECT m.id, 'rate'
            FROM (SELECT DISTINCT rate_key AS key FROM b WHERE why = 'rate') k
            CROSS JOIN LATERAL (
                SELECT i.id FROM instances i
                WHERE i.rate_key = k.key AND i.status = 'available' AND i.parked IS NULL
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
        -- A key whose rows waited behind its parked ones has them all parked
        -- now: its head comes back, in key order, into the room it has.
        IF p_behind IS NOT NULL THEN
            PERFORM unpark_keys(p_behind, gate_names, gate_limits, NULL);
        END IF;
    END IF;
END
$$;

CREATE FUNCTION gendurable.rate_room(keys text[], lim integer, rate_names text[], rate_intervals double precision[], rate_tolerances double precision[]) RETURNS TABLE(key text, room integer)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'gendurable'
    SET jit TO 'off'
    AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT k.key, greatest(k.allowed
               - (SELECT count(*) FROM (SELECT 1 FROM instances a
                                         WHERE a.status = 'available' AND a.parked IS NULL
                                           AND a.rate_key = k.key LIMIT lim) x), 0)::integer
    FROM (SELECT d.key,
                 CASE WHEN d.ri IS NULL THEN lim
                      ELSE least(lim, coalesce(
                          (SELECT CASE WHEN greatest(rs.tat, now()) <= now() + make_interval(secs => rate_tolerances[d.ri])
                                       THEN floor((extract(epoch FROM now() - greatest(rs.tat, now()))::float8
                                                   + rate_tolerances[d.ri]) / rate_intervals[d.ri] + 1e-9)::integer + 1
                                       ELSE 0 END
                           FROM rate_state rs WHERE rs.key = d.key),
                          floor(rate_tolerances[d.ri] / rate_intervals[d.ri] + 1e-9)::integer + 1))
                 END AS allowed
          FROM (SELECT u.key, array_position(rate_names, split_part(u.key, ':', 1)) AS ri
                FROM (SELECT DISTINCT unnest(keys) AS key) u) d) k;
END
$$;

CREATE FUNCTION gendurable.rate_sweep(after text, lim integer, channel text, rate_names text[], rate_intervals double precision[], rate_tolerances double precision[], OUT unparked integer, OUT last_key text, OUT next_in double precision) RETURNS record
    LANGUAGE plpgsql
    SET search_path TO 'gendurable'
    SET jit TO 'off'
    AS $$
DECLARE
    ks text[];
BEGIN
    WITH RECURSIVE k AS (
        (SELECT i.rate_key AS key FROM instances i
         WHERE i.status = 'available' AND i.parked = 'rate' AND i.rate_key > coalesce(after, '')
         ORDER BY i.rate_key LIMIT 1)
        UNION ALL
        SELECT (SELECT i.rate_key FROM instances i
                WHERE i.status = 'available' AND i.parked = 'rate' AND i.rate_key > k.key
                ORDER BY i.rate_key LIMIT 1)
        FROM k WHERE k.key IS NOT NULL
    )
    SELECT coalesce(array_agg(key), '{}') INTO ks FROM (SELECT key FROM k WHERE key IS NOT NULL LIMIT lim) x;
    last_key := CASE WHEN cardinality(ks) >= lim THEN ks[cardinality(ks)] END;

    WITH allow AS (
        -- What the limits allow now; the pick decides, this only puts rows
        -- where it can see them.
        SELECT r.key, r.room AS n
        FROM rate_room(ks, lim, rate_names, rate_intervals, rate_tolerances) r
    ), c AS (
        SELECT p.id FROM allow a CROSS JOIN LATERAL (
            SELECT i.id FROM instances i
            WHERE i.rate_key = a.key AND i.status = 'available' AND i.parked = 'rate'
            ORDER BY i.priority, i.scheduled_at, i.id
            LIMIT a.n
            FOR UPDATE SKIP LOCKED) p
        WHERE a.n > 0
    ), u AS (
        UPDATE instances i SET parked = NULL WHERE i.id = ANY (ARRAY(SELECT c.id FROM c)) RETURNING i.queue
    ), woken AS (
        SELECT pg_notify(channel, q) FROM (SELECT DISTINCT queue AS q FROM u) d WHERE channel IS NOT NULL
    )
    SELECT ((SELECT count(*) FROM u) + 0 * (SELECT count(*) FROM woken))::integer INTO unparked;

    -- GCRA: with `w` rows waiting, the start after them conforms from
    -- max(tat, now) - tolerance + w × interval; never while w reaches the
    -- burst (floor(tolerance / interval) + 1), which only claims change.
    SELECT extract(epoch FROM min(t.at) - now())::float8 INTO next_in
    FROM (
        SELECT greatest(coalesce(rs.tat, now()), now())
                   - make_interval(secs => rate_tolerances[d.ri])
                   + make_interval(secs => w.n * rate_intervals[d.ri]) AS at
        FROM (SELECT u.key, array_position(rate_names, split_part(u.key, ':', 1)) AS ri
              FROM unnest(ks) AS u(key)) d
        LEFT JOIN rate_state rs ON rs.key = d.key
        CROSS JOIN LATERAL (
            SELECT count(*)::integer AS n FROM (
                SELECT 1 FROM instances a
                WHERE a.status = 'available' AND a.parked IS NULL AND a.rate_key = d.key
                LIMIT floor(rate_tolerances[d.ri] / rate_intervals[d.ri] + 1e-9)::integer + 1) x) w
        WHERE d.ri IS NOT NULL
          AND w.n < floor(rate_tolerances[d.ri] / rate_intervals[d.ri] + 1e-9)::integer + 1
    ) t;
END
$$;

CREATE FUNCTION gendurable.reconcile_gates(after text, lim integer, gate_names text[], gate_limits integer[], gate_shards integer[], channel text, OUT changed integer, OUT last_key text) RETURNS record
    LANGUAGE plpgsql
    SET search_path TO 'gendurable'
    SET jit TO 'off'
    AS $$
DECLARE
    lk text[];
    ls integer[];
    n_seen integer;
    grown text[];
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
    ), cfg AS (
        -- The configured limit and shard count of each configured key, and
        -- the shards it has.
        SELECT c.key, gate_limits[c.gi] AS limit_, least(gate_shards[c.gi], gate_limits[c.gi]) AS shards,
               (SELECT count(*) FROM gate_slots g WHERE g.key = c.key) AS have
        FROM (SELECT DISTINCT m.key, array_position(gate_names, split_part(m.key, ':', 1)) AS gi
              FROM mine m) c
        WHERE c.gi IS NOT NULL
    ), truth AS (
        SELECT g.key, g.shard, g.available AS was,
               CASE WHEN c.key IS NOT NULL AND c.have = c.shards
                    THEN (c.limit_ / c.shards + CASE WHEN g.shard < c.limit_ % c.shards THEN 1 ELSE 0 END)
                    ELSE g.capacity
               END AS capacity,
               (SELECT count(*) FROM instances i
                WHERE i.status = 'executing' AND i.concurrency_key = g.key AND i.gate_shard = g.shard)::integer
                   AS executing
        FROM gate_slots g JOIN mine USING (key, shard) LEFT JOIN cfg c ON c.key = g.key
    ), idle AS (
        SELECT g.key FROM gate_slots g LEFT JOIN truth t USING (key, shard)
        WHERE g.key IN (SELECT key FROM mine)
        GROUP BY g.key
        HAVING bool_and(t.executing IS NOT NULL AND t.executing = 0)
    ), del AS (
        DELETE FROM gate_slots g USING idle WHERE g.key = idle.key RETURNING g.key
    ), fix AS (
        UPDATE gate_slots g SET capacity = t.capacity, available = greatest(t.capacity - t.executing, 0)
        FROM truth t
        WHERE g.key = t.key AND g.shard = t.shard
          AND (g.available <> greatest(t.capacity - t.executing, 0) OR g.capacity <> t.capacity)
          AND t.key NOT IN (SELECT key FROM idle)
        RETURNING g.key, greatest(t.capacity - t.executing, 0) > t.was AS grew
    )
    SELECT (SELECT count(*) FROM del) + (SELECT count(*) FROM fix),
           ARRAY(SELECT key FROM del UNION SELECT key FROM fix WHERE grew)
    INTO changed, grown;
    IF cardinality(grown) > 0 THEN
        PERFORM unpark_keys(grown, gate_names, gate_limits, channel);
    END IF;
END
$$;

CREATE FUNCTION gendurable.release_reserved(node_id text, ids bigint[], tokens bigint[]) RETURNS integer
    LANGUAGE sql
    SET search_path TO 'gendurable'
    SET jit TO 'off'
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

CREATE FUNCTION gendurable.unpark_keys(keys text[], gate_names text[], gate_limits integer[], channel text) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'gendurable'
    SET jit TO 'off'
    AS $$
DECLARE
    n integer;
BEGIN
    WITH r AS (
        SELECT key, room FROM key_room(keys, gate_names, gate_limits) WHERE room > 0
    ), c AS (
        SELECT p.id FROM r CROSS JOIN LATERAL (
            SELECT i.id FROM instances i
            WHERE i.concurrency_key = r.key AND i.status = 'available' AND i.parked = 'key'
            ORDER BY i.priority, i.scheduled_at, i.id
            LIMIT r.room
            FOR UPDATE SKIP LOCKED) p
    ), u AS (
        UPDATE instances i SET parked = NULL WHERE i.id = ANY (ARRAY(SELECT c.id FROM c)) RETURNING i.queue
    ), woken AS (
        SELECT pg_notify(channel, q) FROM (SELECT DISTINCT queue AS q FROM u) d WHERE channel IS NOT NULL
    )
    SELECT ((SELECT count(*) FROM u) + 0 * (SELECT count(*) FROM woken))::integer INTO n;
    RETURN n;
END
$$;

CREATE FUNCTION gendurable.unpark_sweep(after text, lim integer, keys boolean, channel text, gate_names text[], gate_limits integer[], rate_names text[], rate_intervals double precision[], rate_tolerances double precision[], OUT unparked integer, OUT last_key text) RETURNS record
    LANGUAGE plpgsql
    SET search_path TO 'gendurable'
    SET jit TO 'off'
    AS $$
DECLARE
    ks text[];
    n_rate integer;
BEGIN
    unparked := 0;
    IF keys THEN
        -- Distinct keys with parked rows, one index probe each.
        WITH RECURSIVE k AS (
            (SELECT i.concurrency_key AS key FROM instances i
             WHERE i.status = 'available' AND i.parked = 'key' AND i.concurrency_key > coalesce(after, '')
             ORDER BY i.concurrency_key LIMIT 1)
            UNION ALL
            SELECT (SELECT i.concurrency_key FROM instances i
                    WHERE i.status = 'available' AND i.parked = 'key' AND i.concurrency_key > k.key
                    ORDER BY i.concurrency_key LIMIT 1)
            FROM k WHERE k.key IS NOT NULL
        )
        SELECT array_agg(key) INTO ks FROM (SELECT key FROM k WHERE key IS NOT NULL LIMIT lim) x;
        unparked := coalesce(unpark_keys(ks, gate_names, gate_limits, channel), 0);
        last_key := CASE WHEN cardinality(ks) >= lim THEN ks[cardinality(ks)] END;
    END IF;

    -- Rate-limited rows, from the first key each time: the rate waker
    -- sweeps them too, when their limits allow.
    SELECT r.unparked INTO n_rate
    FROM rate_sweep(NULL, lim, channel, rate_names, rate_intervals, rate_tolerances) r;
    unparked := unparked + n_rate;
END
$$;

CREATE FUNCTION gendurable.unpark_workflows(queues text[], workflows text[], lim integer, channel text) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'gendurable'
    SET jit TO 'off'
    AS $$
DECLARE
    n integer;
BEGIN
    WITH c AS (
        SELECT p.id FROM unnest(queues) AS q(name) CROSS JOIN unnest(workflows) AS w(name)
        CROSS JOIN LATERAL (
            SELECT i.id FROM instances i
            WHERE i.workflow = w.name AND i.queue = q.name AND i.status = 'available'
              AND i.parked = 'workflow'
            ORDER BY i.priority, i.scheduled_at, i.id
            LIMIT lim
            FOR UPDATE SKIP LOCKED) p
    ), u AS (
        UPDATE instances i SET parked = NULL WHERE i.id = ANY (ARRAY(SELECT c.id FROM c)) RETURNING i.queue
    ), woken AS (
        SELECT pg_notify(channel, d.queue) FROM (SELECT DISTINCT queue FROM u) d
    )
    SELECT (SELECT count(*) FROM u) + 0 * (SELECT count(*) FROM woken) INTO n;
    RETURN n;
END
$$;

CREATE TABLE gendurable.functions (
    name text NOT NULL,
    source text NOT NULL
);

CREATE TABLE gendurable.gate_slots (
    key text NOT NULL,
    shard integer NOT NULL,
    capacity integer NOT NULL,
    available integer NOT NULL,
    CONSTRAINT gate_slots_bounds CHECK (((capacity >= 1) AND (available >= 0) AND (available <= capacity)))
);

CREATE TABLE gendurable.instances (
    id bigint NOT NULL,
    workflow text NOT NULL,
    step text NOT NULL,
    state jsonb NOT NULL,
    queue text DEFAULT 'default'::text NOT NULL,
    priority smallint DEFAULT 0 NOT NULL,
    status text NOT NULL,
    concurrency_key text,
    gate_shard integer,
    rate_key text,
    attempt integer DEFAULT 0 NOT NULL,
    max_attempts integer DEFAULT 20 NOT NULL,
    node text,
    cancel_requested boolean DEFAULT false NOT NULL,
    await_signal text,
    await_until timestamp with time zone,
    wake jsonb,
    errors jsonb DEFAULT '[]'::jsonb NOT NULL,
    inserted_at timestamp with time zone DEFAULT now() NOT NULL,
    scheduled_at timestamp with time zone DEFAULT now() NOT NULL,
    attempted_at timestamp with time zone,
    finished_at timestamp with time zone,
    token bigint DEFAULT 0 NOT NULL,
    parked text,
    CONSTRAINT instances_attempts_check CHECK (((max_attempts >= 1) AND (attempt >= 0))),
    CONSTRAINT instances_parked_check CHECK ((parked = ANY (ARRAY['key'::text, 'rate'::text, 'workflow'::text]))),
    CONSTRAINT instances_priority_check CHECK (((priority >= 0) AND (priority <= 9))),
    CONSTRAINT instances_state_check CHECK ((jsonb_typeof(state) = 'object'::text)),
    CONSTRAINT instances_status_check CHECK ((status = ANY (ARRAY['scheduled'::text, 'available'::text, 'executing'::text, 'awaiting'::text, 'completed'::text, 'cancelled'::text, 'discarded'::text])))
);

ALTER TABLE gendurable.instances ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME gendurable.instances_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE gendurable.nodes (
    id text NOT NULL,
    hostname text NOT NULL,
    pid integer NOT NULL,
    queues jsonb NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    heartbeat_at timestamp with time zone DEFAULT now() NOT NULL,
    workflows jsonb
);

CREATE TABLE gendurable.rate_state (
    key text NOT NULL,
    tat timestamp with time zone NOT NULL
);

ALTER TABLE ONLY gendurable.functions
    ADD CONSTRAINT functions_pkey PRIMARY KEY (name);

ALTER TABLE ONLY gendurable.gate_slots
    ADD CONSTRAINT gate_slots_pkey PRIMARY KEY (key, shard);

ALTER TABLE ONLY gendurable.instances
    ADD CONSTRAINT instances_pkey PRIMARY KEY (id);

ALTER TABLE ONLY gendurable.nodes
    ADD CONSTRAINT nodes_pkey PRIMARY KEY (id);

ALTER TABLE ONLY gendurable.rate_state
    ADD CONSTRAINT rate_state_pkey PRIMARY KEY (key);

CREATE INDEX instances_await_signal ON gendurable.instances USING btree (await_signal) WHERE ((status = 'awaiting'::text) AND (await_signal IS NOT NULL));

CREATE INDEX instances_await_until ON gendurable.instances USING btree (await_until) WHERE ((status = 'awaiting'::text) AND (await_until IS NOT NULL));

CREATE INDEX instances_executing ON gendurable.instances USING btree (node) WHERE (status = 'executing'::text);

CREATE INDEX instances_finished ON gendurable.instances USING btree (finished_at) WHERE (status = ANY (ARRAY['completed'::text, 'cancelled'::text, 'discarded'::text]));

CREATE INDEX instances_gated ON gendurable.instances USING btree (concurrency_key, gate_shard) WHERE ((status = 'executing'::text) AND (gate_shard IS NOT NULL));

CREATE INDEX instances_heads ON gendurable.instances USING btree (concurrency_key) WHERE ((status = 'available'::text) AND (parked IS NULL) AND (concurrency_key IS NOT NULL));

CREATE UNIQUE INDEX instances_k1 ON gendurable.instances USING btree (concurrency_key) WHERE ((status = 'executing'::text) AND (concurrency_key IS NOT NULL) AND (gate_shard IS NULL));

CREATE INDEX instances_key_next ON gendurable.instances USING btree (concurrency_key, ((queue || ''::text)), priority, scheduled_at, id) WHERE ((status = 'available'::text) AND (concurrency_key IS NOT NULL));

CREATE INDEX instances_parked_key ON gendurable.instances USING btree (concurrency_key, priority, scheduled_at, id) WHERE ((status = 'available'::text) AND (parked = 'key'::text));

CREATE INDEX instances_parked_rate ON gendurable.instances USING btree (rate_key, priority, scheduled_at, id) WHERE ((status = 'available'::text) AND (parked = 'rate'::text));

CREATE INDEX instances_parked_workflow ON gendurable.instances USING btree (workflow, queue, priority, scheduled_at, id) WHERE ((status = 'available'::text) AND (parked = 'workflow'::text));

CREATE INDEX instances_pick ON gendurable.instances USING btree (queue, priority, scheduled_at, id) WHERE ((status = 'available'::text) AND (parked IS NULL));

CREATE INDEX instances_rate_heads ON gendurable.instances USING btree (rate_key) WHERE ((status = 'available'::text) AND (parked IS NULL) AND (rate_key IS NOT NULL));

CREATE INDEX instances_reserved ON gendurable.instances USING btree (node) WHERE ((status = 'available'::text) AND (node IS NOT NULL));

CREATE INDEX instances_scheduled ON gendurable.instances USING btree (scheduled_at) WHERE (status = 'scheduled'::text);

