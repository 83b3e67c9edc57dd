-- Outcomes, promotions, handovers, claims and reservations in one call (one
-- round trip, one commit).
--
-- `plain_ids`/`plain_tokens`/`plain_steps`/`plain_states`: keyless rows
-- done (step NULL) or moved on to their next step now, the common case, as
-- typed arrays (no JSON to parse, no per-kind cases); `outcomes`: every
-- other outcome, as a JSON array (see OutcomeRow). An outcome applies
-- only while its row is executing on this node under its token and still
-- holds the key and shard the outcome names, so a late outcome of a rescued
-- row is dropped; `next`/`ntoken` name the reserved successor the node
-- started in the slot it frees and that reservation's token. A successor is
-- promoted only if its predecessor's outcome applied in this call, and the
-- node starts it before this call: an outcome naming a successor applies only
-- together with that promotion, so the key or slot never goes free while the
-- successor runs.
--
-- A key or gate slot an outcome frees goes straight to the next row of its
-- key (a handover, parked or not), when the node has room for it; a key the
-- outcomes leave with room gets its next parked rows unparked into it.
--
-- `queues`/`demands`: how many rows to claim per queue (empty: record the
-- outcomes only); `skip_pick` set: the caller knows a pick would find nothing
-- new; `reserve` set: reserve a successor for each keyed row claimed or
-- promoted in that queue (the node has room its keys cannot fill, so slots
-- hand over without a round trip). `unreserve`/`unreserve_tokens`:
-- reservations the node gives back. The remaining parameters are the pick's.
--
-- Returns the claimed rows (reserved = false), the reserved ones (reserved =
-- true), and one header row with `written` (outcomes applied), `released`
-- (freed keys and slots nobody took over), `handed_over`, `released_keys`
-- (the freed keys still free at the end of the call, so a key the pick took
-- again wakes nobody) and `promoted`: every successor named in the call that
-- runs under this node now (promoted here, or by an earlier call whose answer
-- was lost). A successor not listed was not admitted, and its node must not
-- let it finish.
CREATE OR REPLACE FUNCTION handoff(plain_ids bigint[], plain_tokens bigint[], plain_steps text[],
                        plain_states jsonb[],
                        outcomes jsonb, node_id text, channel text, notify boolean,
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
    n_plain integer := 0;
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
    -- The named successors this call can promote.
    e_ok bigint[] := '{}';
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
    -- Instances the outcomes moved to await a signal, and its name.
    a_id bigint[];
    a_signal text[];
    -- Paused queues among the caller's.
    paused text[];
    picked claim[];
    -- Per queue: how many more keyed rows the node may hold (node_key_room),
    -- NULL when it serves the queue alone or hands nothing over there.
    k_rooms integer[] := '{}';
    -- Queues where the node holds more than its share of the keys.
    over_share text[];
    d integer;
    q integer;
BEGIN
    -- A paused queue claims nothing: no promotion, handover, pick or
    -- reservation (its outcomes are recorded all the same).
    SELECT array_agg(p.queue) INTO paused FROM queue_pauses p WHERE p.queue = ANY (queues);
    IF paused IS NOT NULL THEN
        FOR q IN 1 .. cardinality(queues) LOOP
            IF queues[q] = ANY (paused) THEN
                demands[q] := 0;
                reserve[q] := false;
            END IF;
        END LOOP;
    END IF;

    -- The general statement below, for a row that holds no key and is done
    -- or moves on to its next step now (no delay, key or rate limit):
    -- nothing freed, nothing to hand over or promote. Each element reaches
    -- its row through the primary key (`status || ''` keeps the planner off
    -- instances_executing, which on stale statistics it may take for one row
    -- and scan once per element of the arrays).
    IF cardinality(plain_ids) > 0 THEN
        UPDATE instances i SET
            status = CASE WHEN o.step IS NULL THEN 'completed'
                          WHEN i.cancel_requested THEN 'cancelled'
                          ELSE 'available' END,
            step = coalesce(o.step, i.step), state = o.state, rate_key = NULL, attempt = 0,
            wake = NULL, scheduled_at = now(), await_signal = NULL, await_until = NULL,
            finished_at = CASE WHEN o.step IS NULL OR i.cancel_requested THEN now() END,
            node = NULL, gate_shard = NULL
        FROM unnest(plain_ids, plain_tokens, plain_steps, plain_states) AS o(id, token, step, state)
        WHERE i.id = o.id AND i.status || '' = 'executing' AND i.node = node_id AND i.token = o.token
          AND i.concurrency_key IS NULL AND i.gate_shard IS NULL;
        GET DIAGNOSTICS n_plain = ROW_COUNT;
    END IF;

    IF jsonb_array_length(outcomes) > 0 THEN
        -- The named successors the promotion below will take (its
        -- conditions, locked here so that nothing changes them meanwhile):
        -- the outcomes naming the others do not apply, and their node stops
        -- the successor and records the outcome alone. Each through the
        -- primary key (`status || ''`: no index of available rows, which a
        -- backlog can fill, is a candidate whatever the statistics say).
        IF jsonb_path_exists(outcomes, '$[*].next') THEN
            SELECT coalesce(array_agg(s.id), '{}') INTO e_ok FROM (
                SELECT i.id
                FROM jsonb_to_recordset(outcomes) AS o(id bigint, hkey text, next bigint, ntoken bigint)
                JOIN instances p ON p.id = o.id
                JOIN instances i ON i.id = o.next
                WHERE i.status || '' = 'available' AND i.node = node_id AND i.token = o.ntoken
                  AND i.concurrency_key = o.hkey AND i.queue = p.queue
                  AND NOT (i.queue = ANY (coalesce(paused, '{}')))
                ORDER BY i.id
                FOR UPDATE OF i) s;
        END IF;
        -- The locks of the signals awaited, in order (see send_signal): a
        -- signal sent meanwhile by name waits, then wakes them.
        PERFORM pg_advisory_xact_lock(hashtext(current_schema() || '.signal'), hashtext(s.name))
        FROM (SELECT DISTINCT o ->> 'signal' AS name FROM jsonb_array_elements(outcomes) o
              WHERE o ->> 'status' = 'awaiting' AND o ->> 'signal' IS NOT NULL
              ORDER BY 1) s;
        WITH o AS (
            SELECT * FROM jsonb_to_recordset(outcomes) AS o(
                id bigint, token bigint, kind text, status text, step text, state jsonb,
                set_key boolean, ckey text, rkey text, delay float8, until timestamptz,
                signal text, error jsonb, hkey text, gshard integer, next bigint, ntoken bigint)
        ), upd AS (
            -- Each row by id (`status || ''`, as above).
            UPDATE instances i SET
                status = CASE WHEN i.cancel_requested AND o.status NOT IN ('completed', 'cancelled', 'discarded')
                              THEN 'cancelled' ELSE o.status END,
                step = coalesce(o.step, i.step),
                state = coalesce(o.state, i.state),
                concurrency_key = CASE WHEN o.set_key THEN o.ckey ELSE i.concurrency_key END,
                rate_key = CASE WHEN o.kind IN ('snooze', 'error', 'discard', 'release') THEN i.rate_key
                                ELSE o.rkey END,
                attempt = CASE o.kind WHEN 'error' THEN i.attempt
                                      WHEN 'discard' THEN i.attempt
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
                gate_shard = NULL,
                -- A row moving on to its next step is no longer suspected of
                -- ending its process (see the cautious migration).
                cautious = i.cautious AND o.kind IN ('snooze', 'error', 'discard', 'release')
            FROM o
            WHERE i.id = o.id AND i.status || '' = 'executing' AND i.node = node_id AND i.token = o.token
              AND i.concurrency_key IS NOT DISTINCT FROM o.hkey
              AND i.gate_shard IS NOT DISTINCT FROM o.gshard
              AND (o.next IS NULL OR o.next = ANY (e_ok))
            RETURNING i.id, i.status, i.await_signal, i.queue, o.hkey, o.gshard, o.next, o.ntoken
        )
        SELECT count(*)::integer,
               array_agg(u.hkey) FILTER (WHERE u.hkey IS NOT NULL),
               array_agg(u.gshard) FILTER (WHERE u.hkey IS NOT NULL),
               array_agg(u.queue) FILTER (WHERE u.hkey IS NOT NULL),
               array_agg(u.next) FILTER (WHERE u.hkey IS NOT NULL),
               array_agg(u.ntoken) FILTER (WHERE u.hkey IS NOT NULL),
               (SELECT array_agg(o.next) FROM o WHERE o.next IS NOT NULL),
               (SELECT array_agg(o.ntoken) FROM o WHERE o.next IS NOT NULL),
               array_agg(u.id) FILTER (WHERE u.status = 'awaiting' AND u.await_signal IS NOT NULL),
               array_agg(u.await_signal) FILTER (WHERE u.status = 'awaiting' AND u.await_signal IS NOT NULL)
        INTO n_written, f_key, f_shard, f_queue, f_next, f_ntoken, n_next, n_ntoken, a_id, a_signal
        FROM upd u;
    END IF;

    -- Deliver the signals kept for instances that now await them: the
    -- oldest sent to the instance, else the oldest sent by name and not
    -- expired. Each is deleted as it is delivered: once.
    IF a_id IS NOT NULL THEN
        WITH msg AS (
            SELECT a.id, coalesce(
                (SELECT m.id FROM mailbox m WHERE m.instance = a.id AND m.name = a.signal
                 ORDER BY m.id LIMIT 1),
                (SELECT m.id FROM mailbox m WHERE m.instance IS NULL AND m.name = a.signal
                   AND m.expires_at > now()
                 ORDER BY m.id LIMIT 1)) AS mid
            FROM unnest(a_id, a_signal) AS a(id, signal)
        ), taken AS (
            DELETE FROM mailbox m USING msg WHERE m.id = msg.mid
            RETURNING msg.id, m.name, m.payload
        ), woke AS (
            UPDATE instances i
            SET status = 'available', wake = jsonb_build_object('signal', t.name, 'payload', t.payload),
                await_signal = NULL, await_until = NULL, scheduled_at = now()
            FROM taken t
            WHERE i.id = t.id AND i.status = 'awaiting'
            RETURNING i.queue
        )
        SELECT count(*)::integer INTO d
        FROM (SELECT pg_notify(channel, w.q) FROM (SELECT DISTINCT queue AS q FROM woke) w) n;
    END IF;

    -- Promote the successors started in freed slots: each takes its
    -- predecessor's shard (same key, same queue, so no counter changes). The
    -- predecessor left 'executing' in the statement above, so the K = 1 index
    -- sees one executing row per key throughout. Through the primary key, as
    -- above.
    IF f_next IS NOT NULL THEN
        WITH p AS (
            SELECT p.* FROM unnest(f_next, f_ntoken, f_shard, f_key, f_queue) AS p(id, ntoken, shard, key, queue)
            WHERE p.id IS NOT NULL
        ), moved AS (
            UPDATE instances i
            SET status = 'executing', attempt = i.attempt + 1, attempted_at = now(), gate_shard = p.shard,
                token = i.token + 1
            FROM p
            WHERE i.id = p.id AND i.status || '' = 'available' AND i.node = node_id AND i.token = p.ntoken
              AND i.concurrency_key = p.key AND i.queue = p.queue
              AND NOT (p.queue = ANY (coalesce(paused, '{}')))
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
        WHERE i.status || '' = 'executing' AND i.node = node_id AND i.token = n.ntoken + 1;
    END IF;

    -- Hand the keys and slots no successor took over to the next rows of the
    -- same keys in the same queues, as far as the caller's demand goes: the
    -- node has room, and these rows can run now (their key was just held).
    -- Reaching a key's rows through its own index entries costs the same
    -- however deep the backlog. Rows under a configured rate limit are left
    -- to the pick. A handed-over row takes the freed gate shard, so no
    -- counter changes. A K = 1 key needs no claim_key here: the row that
    -- held it leaves 'executing' in this same transaction, so no other
    -- picker ever sees the key free. The pick gets the demand left. A node
    -- sharing the queue hands over no more than its share of the keys
    -- (node_key_room, the keys just freed counted as free ones): the rest go
    -- free, to whichever node's pick has room for them.
    IF array_position(f_next, NULL) IS NOT NULL THEN
        FOR q IN 1 .. coalesce(cardinality(queues), 0) LOOP
            IF demands[q] > 0 AND queues[q] = ANY (f_queue) THEN
                k_rooms[q] := node_key_room(queues[q], node_id,
                                            ARRAY(SELECT f.key FROM unnest(f_key, f_queue, f_next) AS f(key, queue, next)
                                                  WHERE f.queue = queues[q] AND f.next IS NULL));
            END IF;
        END LOOP;
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
            WHERE c.qn <= least(demands[array_position(queues, c.queue)],
                                k_rooms[array_position(queues, c.queue)])
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
        IF d > 0 AND NOT skip_pick[q] AND NOT (true = ANY (reserve)) THEN
            -- In pick order (a function scan keeps it). Nothing to reserve:
            -- the claimed rows go out as they come.
            RETURN QUERY
            SELECT p, false, NULL::integer, NULL::integer, NULL::integer, NULL::text[], NULL::bigint[]
            FROM pick(queues[q], d, ceil(d * win_factor)::integer + 8,
                      workflows, node_id, gate_names, gate_limits, gate_shards,
                      rate_names, rate_intervals, rate_tolerances) p;
        ELSIF d > 0 AND NOT skip_pick[q] THEN
            -- Kept to reserve successors for their keyed rows below.
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
        WHERE i.id = ANY (c_id) AND i.status || '' = 'executing' AND i.node = node_id
          AND i.concurrency_key IS NOT NULL AND reserve[array_position(queues, i.queue)]
          AND (i.rate_key IS NULL
               OR array_position(rate_names, split_part(i.rate_key, ':', 1)) IS NULL);
    END IF;

    -- Reserve a successor per keyed row that wants one: the next runnable rows
    -- of its key and queue nobody holds, unless cautious (taken back from a
    -- node that ended: it starts only once claimed). Only for keys that are full (K = 1,
    -- or a gate with no slot left): a row a free slot could admit now is left
    -- to the pick. Rows under a configured rate limit are left to the pick,
    -- which checks the limit. Not in a queue where the node holds more than
    -- its share of the keys (another node joined): their keys go free as
    -- their rows end, through the handover's check.
    -- The share is counted once per queue: materialised, or the planner
    -- pushes the condition below the DISTINCT and counts it once per row.
    IF cardinality(w_key) > 0 THEN
        WITH o AS MATERIALIZED (SELECT DISTINCT x AS wq FROM unnest(w_queue) x)
        SELECT array_agg(o.wq) INTO over_share FROM o
        WHERE node_key_room(o.wq, node_id, '{}') < 0;
    END IF;
    IF over_share IS NOT NULL THEN
        SELECT coalesce(array_agg(w.key), '{}'), coalesce(array_agg(w.queue), '{}')
        INTO w_key, w_queue
        FROM unnest(w_key, w_queue) AS w(key, queue)
        WHERE NOT (w.queue = ANY (over_share));
    END IF;
    IF cardinality(w_key) > 0 THEN
        RETURN QUERY
        WITH w AS (
            SELECT k.key, k.queue, count(*)::integer AS n
            FROM unnest(w_key, w_queue) AS k(key, queue)
            WHERE NOT EXISTS (SELECT 1 FROM gate_slots s WHERE s.key = k.key AND s.available > 0)
            GROUP BY 1, 2
        ), nxt AS (
            SELECT n.id FROM w CROSS JOIN LATERAL (
                SELECT i.id, i.cautious FROM instances i
                WHERE i.concurrency_key = w.key AND i.queue || '' = w.queue AND i.status = 'available'
                  AND i.node IS NULL AND i.workflow = ANY (workflows)
                  AND (i.rate_key IS NULL
                       OR array_position(rate_names, split_part(i.rate_key, ':', 1)) IS NULL)
                ORDER BY i.priority, i.scheduled_at, i.id
                LIMIT w.n
                FOR UPDATE SKIP LOCKED) n
            WHERE NOT n.cautious
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
    -- So do runnable keyed rows a pick left for the other nodes' shares.
    IF notify AND (cardinality(r_key) + n_unreserved > 0
                   OR current_setting('gendurable.share_left', true) = 'on') THEN
        PERFORM pg_notify(channel, '*' || node_id);
    END IF;
    RETURN QUERY SELECT NULL::claim, NULL::boolean, n_written + n_plain, cardinality(r_key) + n_unreserved,
                        coalesce(cardinality(h_id), 0), r_key, p_id;
END
$$;
