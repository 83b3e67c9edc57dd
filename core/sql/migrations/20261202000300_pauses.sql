-- Paused queues: no node claims from them until they are resumed (their
-- running steps finish and record their outcomes). Read by handoff and by
-- the insert that starts rows on the inserting node.
CREATE TABLE queue_pauses (
    queue     text        PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now()
);
