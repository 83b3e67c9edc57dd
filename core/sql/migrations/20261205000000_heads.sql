-- The rows of a key (or a rate limit) waiting unparked, its heads, are counted
-- against its room on every insert, pick and sweep. Their indexes used to
-- carry the pick's own condition (status = 'available' AND parked IS NULL),
-- so every index of available rows could answer a heads lookup too, and the
-- planner chose between them on statistics sampled from a table that is
-- mostly finished rows: now and then it read a key's heads through the pick's
-- index, every available row for each key (seconds per call at a backlog of
-- thousands; benchmarks/README.md, Soak). The heads are now the rows whose
-- coalesce(parked, status) is 'available' (parked is NULL or names what it
-- waits for, never 'available'): the same rows, in a form no other index's
-- condition follows from, so only these indexes can serve the lookups that
-- say it that way.
-- IF NOT EXISTS: an operator may have built them beforehand, CONCURRENTLY.
CREATE INDEX IF NOT EXISTS instances_key_heads ON instances (concurrency_key)
    WHERE coalesce(parked, status) = 'available' AND concurrency_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS instances_rate_key_heads ON instances (rate_key)
    WHERE coalesce(parked, status) = 'available' AND rate_key IS NOT NULL;
DROP INDEX IF EXISTS instances_heads;
DROP INDEX IF EXISTS instances_rate_heads;
