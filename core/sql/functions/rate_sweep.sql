-- Up to `lim` rate-limit keys with parked rows, from the first after `after`
-- (NULL: from the start), each unparked as far as its limit allows starts
-- now (a name no longer configured: all of them, `lim` at a time). Returns
-- the rows unparked, the last key swept (NULL once the sweep reached the end)
-- and `next_in`: the seconds until one of these keys allows a start beyond
-- the rows waiting unparked now, as if those were claimed meanwhile (NULL:
-- none will, before a claim). The rate waker sleeps that long: one sweep per
-- start, not one per pick.
--
-- One sweep at a time: every node's waker computes the same `next_in` from
-- the same state and wakes at the same instant, and sweeps side by side would
-- each unpark what the limit allows (neither sees the other's rows), for the
-- picks to park again. A timed call that finds another sweeping returns at
-- once, all NULL: that sweep, begun at the same time, covers these keys and
-- times the next start. A call after a claim (`wait_turn`) waits for it
-- instead: a sweep begun before the claim committed may not have seen it.
--
-- The calling node has `own_room` free claim slots in each of `own_queues`:
-- a queue whose unparked rows fit there is left to that node's picker
-- (returned in `own_woken`), any other is woken on `channel` for every node.
-- One node picks what one sweep unparked, not all of them.
CREATE OR REPLACE FUNCTION rate_sweep(after text, lim integer, channel text,
                           rate_names text[], rate_intervals float8[], rate_tolerances float8[],
                           own_queues text[], own_room integer[], wait_turn boolean,
                           OUT unparked integer, OUT last_key text, OUT next_in float8,
                           OUT own_woken text[])
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET jit = off
AS $$
DECLARE
    ks text[];
    notified bigint;
BEGIN
    unparked := 0;
    own_woken := '{}';
    IF wait_turn THEN
        PERFORM pg_advisory_xact_lock(hashtext(current_schema() || ':rate_sweep'));
    ELSIF NOT pg_try_advisory_xact_lock(hashtext(current_schema() || ':rate_sweep')) THEN
        RETURN;
    END IF;
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
    ), q AS (
        SELECT u.queue, count(*) AS n,
               coalesce((SELECT o.room FROM unnest(own_queues, own_room) AS o(queue, room)
                         WHERE o.queue = u.queue), 0) AS room
        FROM u GROUP BY u.queue
    ), woken AS (
        SELECT pg_notify(channel, q.queue) FROM q WHERE q.n > q.room AND channel IS NOT NULL
    )
    SELECT (SELECT coalesce(sum(q.n), 0) FROM q)::integer,
           (SELECT coalesce(array_agg(q.queue), '{}') FROM q WHERE q.n <= q.room),
           (SELECT count(*) FROM woken)
    INTO unparked, own_woken, notified;

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
                WHERE a.rate_key = d.key AND coalesce(a.parked, a.status) = 'available'
                LIMIT floor(rate_tolerances[d.ri] / rate_intervals[d.ri] + 1e-9)::integer + 1) x) w
        WHERE d.ri IS NOT NULL
          AND w.n < floor(rate_tolerances[d.ri] / rate_intervals[d.ri] + 1e-9)::integer + 1
    ) t;
END
$$;
