-- A key's next rows in one queue, for the handover and the reservation of
-- successors, whatever the key has in other queues. Without the queue in the
-- index, a handover in one queue stepped over every row the key had in
-- another: 42 ms a call with 100,000 of them (benchmarks/deep_backlog.sql
-- and a node on it). The queries name the queue as `queue || ''`; the index
-- holds that same expression, which instances_pick (led by the plain column)
-- cannot serve, so a generic plan made before any statistics still cannot
-- stray to walking a whole queue per key (see 20261130000003).
DROP INDEX instances_key_next;
CREATE INDEX instances_key_next ON instances (concurrency_key, (queue || ''), priority, scheduled_at, id)
    WHERE status = 'available' AND concurrency_key IS NOT NULL;
