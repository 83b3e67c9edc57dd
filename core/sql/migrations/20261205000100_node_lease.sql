-- Each node records the lease it is presumed dead after, so that statements
-- without the caller's lease (the share of a queue's keys, node_key_room)
-- can leave out the nodes presumed dead before the reaper forgets them.
-- NULL: a node of an earlier release, counted as alive while it is listed.
ALTER TABLE nodes ADD COLUMN IF NOT EXISTS lease_s double precision;
