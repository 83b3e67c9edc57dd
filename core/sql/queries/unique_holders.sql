-- The instances that hold unique keys $1 (see insert.sql), by key.
SELECT unique_key, id FROM __S__.instances
WHERE unique_key = ANY ($1::bytea[]) AND status = ANY (unique_states)
