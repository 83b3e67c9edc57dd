-- Unique inserts and idempotency keys (sql/functions/unique_key.sql). A row
-- inserted with either holds the digest of its identity and the statuses in
-- which it refuses a duplicate; the unique index holds the row while its
-- status is one of them. Every status a row moves between while it runs is
-- among them (the CHECK), so no engine write takes a row out of the index
-- and back in.
ALTER TABLE instances ADD COLUMN IF NOT EXISTS unique_key bytea,
                      ADD COLUMN IF NOT EXISTS unique_states text[];

ALTER TABLE instances ADD CONSTRAINT instances_unique_check CHECK (
    (unique_key IS NULL) = (unique_states IS NULL)
    AND unique_states <@ ARRAY['scheduled', 'available', 'executing', 'awaiting',
                               'completed', 'cancelled', 'discarded']
    AND unique_states @> ARRAY['scheduled', 'available', 'executing', 'awaiting']
) NOT VALID;
ALTER TABLE instances VALIDATE CONSTRAINT instances_unique_check;

-- IF NOT EXISTS: an operator may have built it beforehand, CONCURRENTLY.
CREATE UNIQUE INDEX IF NOT EXISTS instances_unique ON instances (unique_key)
    WHERE unique_key IS NOT NULL AND status = ANY (unique_states);

-- enqueue() now also takes the unique options and says whether it inserted.
DROP FUNCTION IF EXISTS enqueue(text, jsonb, text, text, integer, text, text, integer, timestamptz);
DELETE FROM functions WHERE name = 'enqueue';
