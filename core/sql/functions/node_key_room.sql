-- How many more keyed rows the node `node_id` may hold executing in queue
-- `q` (negative: that many too many), or NULL when no other node serves `q`.
--
-- A node that shares a queue holds its share of the keys in play: the keyed
-- rows executing there on any node plus the keys `free` for the taking (those
-- in a pick's window, or those an outcome call just freed), in
-- proportion to its concurrency among the nodes serving the queue, and at
-- least as many as it runs at once. A key it claimed ahead waits on it while
-- another node's free slots could run it (with 40 keys and two nodes of 20,
-- the first to claim ahead took all 40 and the other idled), and a key stays
-- with the node that runs it (an outcome call hands a freed key to its next
-- row, and reserves the row after it), so a node that joins late would get
-- no keys at all; but with more keys than slots, a node that holds only what
-- it runs leaves each slot idle for a round trip between a key's rows. A
-- lone node claims keyed rows ahead and counts nothing.
--
-- The keyed rows executing are read through the keys' own indexes: a few
-- per key, where the node's index also holds its keyless rows.
-- Nodes presumed dead (no heartbeat within their lease) are left out: their
-- slots run nothing, and counting them would shrink the live nodes' shares
-- until the reaper forgets them.
CREATE OR REPLACE FUNCTION node_key_room(q text, node_id text, free text[])
RETURNS integer
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
SET jit = off
AS $$
DECLARE
    room integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM nodes o
                   WHERE o.id <> node_id AND o.queues ? q
                     AND (o.lease_s IS NULL OR o.heartbeat_at > now() - make_interval(secs => o.lease_s))) THEN
        RETURN NULL;
    END IF;
    SELECT greatest(s.own - s.mine,
                    ceil((s.free + s.held)::numeric * s.own / nullif(s.total, 0))::integer - s.mine)
    INTO room
    FROM (SELECT (n.queues ->> q)::integer AS own, sum((o.queues ->> q)::integer) AS total,
                 coalesce(sum(h.n), 0) AS held,
                 coalesce(sum(h.n) FILTER (WHERE o.id = node_id), 0) AS mine,
                 (SELECT count(DISTINCT k) FROM unnest(free) k) AS free
          FROM nodes n
          JOIN nodes o ON o.queues ? q
                      AND (o.id = node_id OR o.lease_s IS NULL
                           OR o.heartbeat_at > now() - make_interval(secs => o.lease_s))
          LEFT JOIN (
              SELECT e.node, count(*) AS n
              FROM (SELECT k.node, k.queue FROM instances k
                    WHERE k.status = 'executing' AND k.concurrency_key IS NOT NULL AND k.gate_shard IS NULL
                    UNION ALL
                    SELECT g.node, g.queue FROM instances g
                    WHERE g.status = 'executing' AND g.gate_shard IS NOT NULL) e
              WHERE e.queue = q
              GROUP BY e.node) h ON h.node = o.id
          WHERE n.id = node_id
          GROUP BY n.queues) s;
    RETURN room;
END
$$;
