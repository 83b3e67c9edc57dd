-- Outcomes of executed steps, many in one statement. $1 is a JSON array of
-- outcomes, $2 the node id, $3 the wake-up channel, $4 whether to notify
-- other nodes. A row is only touched while it is still executing under the
-- same claim (node and attempt): a late outcome of a rescued row is dropped. Each gate slot is credited back to the shard it was debited from,
-- in this same transaction, locking the counters in key order.
WITH o AS (
    SELECT * FROM jsonb_to_recordset($1::jsonb) AS o(
        id bigint, attempt integer, kind text, status text, step text, state jsonb,
        set_key boolean, ckey text, rkey text, delay float8, until timestamptz,
        signal text, error jsonb, gkey text, gshard integer, held boolean)
), upd AS (
    UPDATE __S__.instances i SET
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
    WHERE i.id = o.id AND i.status = 'executing' AND i.node = $2 AND i.attempt = o.attempt
    RETURNING i.id, i.queue, o.gkey, o.gshard, o.held AS released
), credit AS (
    SELECT gkey, gshard, count(*)::integer AS n FROM upd WHERE gshard IS NOT NULL GROUP BY 1, 2
), locked AS (
    SELECT g.key, g.shard, g.available, g.capacity, c.n FROM __S__.gate_slots g
    JOIN credit c ON c.gkey = g.key AND c.gshard = g.shard
    ORDER BY g.key, g.shard
    FOR UPDATE OF g
), credited AS (
    -- From the locked version (see the pick); least(): never above capacity.
    UPDATE __S__.gate_slots g SET available = least(l.available + l.n, l.capacity)
    FROM locked l
    WHERE g.key = l.key AND g.shard = l.shard
    RETURNING 1
), notified AS (
    -- Rows waiting for a released key or slot may sit in any queue: wake all
    -- queues of the other nodes ('*' and the sender, which claims for its own
    -- freed slots in this same transaction).
    -- $4: only when other nodes are alive (a lone node claims for itself; a
    -- node that starts meanwhile polls until our next heartbeat sees it).
    SELECT pg_notify($3, '*' || $2) FROM (SELECT 1 FROM upd WHERE released AND $4 LIMIT 1) r
)
SELECT u.id, (SELECT count(*) FROM notified) AS notified FROM upd u
