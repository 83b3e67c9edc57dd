-- Many instances in one statement, from parallel arrays. Rows due now are
-- 'available' and wake the pickers of their queue (on commit, so an insert in
-- the caller's transaction wakes nobody until it commits). Rows flagged in
-- $12 are claimed by the inserting node $13 as they are inserted (see
-- `Engine::insert_many`): they start there without a pick and wake nobody
-- (not while their queue is paused: then they are inserted as any other).
-- Rows due now are parked (they wait out of the pick's index): those of a
-- workflow none of their queue's live nodes runs (`orphaned`, nodes live
-- within $19 seconds); else those beyond the room their key has
-- (insert_room, with the gate names and limits $14/$15); else those beyond
-- the room their rate limit has (rate_room, with the rate limits
-- $16/$17/$18).
-- Unique rows ($20: a spec for unique_key, or null) are inserted unless an
-- instance holds their identity or an earlier row of the batch has it; one
-- that a concurrent insert took meanwhile is skipped by ON CONFLICT. Each row
-- comes back in input order with its id (a conflict's holder, when this
-- statement could see it) and whether it conflicted; the caller looks up the
-- holders it could not see by `ukey`.
WITH given AS (
    SELECT u.*, coalesce(u.at, now() + make_interval(secs => coalesce(u.delay, 0))) AS due,
           NOT u.here AND u.at IS NULL AND coalesce(u.delay, 0) <= 0 AS due_now,
           CASE WHEN u.uspec IS NOT NULL
                THEN __S__.unique_key(u.workflow, u.state::jsonb, u.ckey, u.uspec::jsonb) END AS ukey
    FROM (
        -- A row asked to start here does not when its queue is paused.
        SELECT a.*, a.asked AND NOT EXISTS (SELECT 1 FROM __S__.queue_pauses p WHERE p.queue = a.queue)
                    AS here
        FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::smallint[], $6::text[],
                    $7::text[], $8::integer[], $9::float8[], $10::timestamptz[], $12::boolean[],
                    $20::text[])
             WITH ORDINALITY AS a(workflow, step, state, queue, priority, ckey, rkey, max_attempts,
                                  delay, at, asked, uspec, ord)) u
), held AS (
    SELECT g.ord,
           (SELECT e.id FROM __S__.instances e
            WHERE e.unique_key = g.ukey AND e.status = ANY (e.unique_states)) AS holder,
           row_number() OVER (PARTITION BY g.ukey ORDER BY g.ord) > 1 AS repeat
    FROM given g WHERE g.ukey IS NOT NULL
), todo AS (
    -- Ids drawn in input order (the subquery sorts before nextval runs), so
    -- that rows come back matched to their input.
    SELECT t.*, nextval('__S__.instances_id_seq'::regclass) AS id
    FROM (SELECT g.* FROM given g LEFT JOIN held h ON h.ord = g.ord
          WHERE h.ord IS NULL OR (h.holder IS NULL AND NOT h.repeat)
          ORDER BY g.ord) t
), pairs AS MATERIALIZED (
    -- Materialised: as a subquery, the planner pushes the orphaned() test
    -- below the DISTINCT and asks it once per row.
    SELECT DISTINCT queue, workflow FROM todo WHERE due_now
), orphans AS (
    SELECT p.queue, p.workflow FROM pairs p WHERE __S__.orphaned(p.queue, p.workflow, $19)
), input AS (
    -- now_due: due now and waiting for the pick (not parked for its workflow).
    SELECT g.*, o.queue IS NOT NULL AS orphan, g.due_now AND o.queue IS NULL AS now_due
    FROM todo g LEFT JOIN orphans o ON o.queue = g.queue AND o.workflow = g.workflow AND g.due_now
), kroom AS (
    SELECT * FROM __S__.insert_room(
        (SELECT array_agg(ckey) FROM input WHERE now_due AND ckey IS NOT NULL), $14, $15)
), kranked AS (
    SELECT i.*, i.now_due AND i.ckey IS NOT NULL
                AND row_number() OVER (PARTITION BY i.ckey, i.now_due ORDER BY i.priority, i.ord)
                    > coalesce((SELECT room FROM kroom WHERE kroom.key = i.ckey), 0) AS kpark
    FROM input i
), rroom AS (
    SELECT * FROM __S__.rate_room(
        (SELECT array_agg(rkey) FROM kranked WHERE now_due AND rkey IS NOT NULL AND NOT kpark),
        (SELECT count(*)::integer FROM input), $16, $17, $18)
), ranked AS (
    SELECT k.*, CASE WHEN k.orphan THEN 'workflow'
                     WHEN k.kpark THEN 'key'
                     WHEN k.now_due AND k.rkey IS NOT NULL
                          AND row_number() OVER (PARTITION BY k.rkey, k.now_due AND NOT k.kpark
                                                 ORDER BY k.priority, k.ord)
                              > coalesce((SELECT room FROM rroom WHERE rroom.key = k.rkey), 0)
                     THEN 'rate'
                END AS parked
    FROM kranked k
), ins AS (
    INSERT INTO __S__.instances (id, workflow, step, state, queue, priority, concurrency_key, rate_key,
                                 max_attempts, status, scheduled_at, node, attempt, attempted_at, token,
                                 parked, unique_key, unique_states)
    SELECT r.id, r.workflow, r.step, r.state::jsonb, r.queue, r.priority, r.ckey, r.rkey, r.max_attempts,
           CASE WHEN r.here THEN 'executing' WHEN r.due > now() THEN 'scheduled' ELSE 'available' END,
           r.due,
           CASE WHEN r.here THEN $13 END,
           CASE WHEN r.here THEN 1 ELSE 0 END,
           CASE WHEN r.here THEN now() END,
           CASE WHEN r.here THEN 1 ELSE 0 END,
           r.parked,
           r.ukey,
           CASE WHEN r.ukey IS NOT NULL
                THEN ARRAY(SELECT jsonb_array_elements_text(r.uspec::jsonb -> 'states')) END
    FROM ranked r
    -- Unique rows in the order of their keys: two batches that share keys
    -- take them in the same order, so neither waits for the other while
    -- holding what the other waits for (a deadlock).
    ORDER BY r.ukey NULLS LAST, r.ord
    ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND status = ANY (unique_states) DO NOTHING
    RETURNING id, queue, status, CASE WHEN status = 'executing' THEN state END AS state
), notified AS (
    SELECT pg_notify($11, q) FROM (SELECT DISTINCT queue AS q FROM ins WHERE status = 'available') d
)
SELECT coalesce(ins.id, h.holder) AS id, ins.id IS NULL AS conflict, ins.state,
       CASE WHEN ins.id IS NULL THEN g.ukey END AS ukey,
       (SELECT count(*) FROM notified) AS notified
FROM given g
LEFT JOIN todo t ON t.ord = g.ord
LEFT JOIN ins ON ins.id = t.id
LEFT JOIN held h ON h.ord = g.ord
ORDER BY g.ord
