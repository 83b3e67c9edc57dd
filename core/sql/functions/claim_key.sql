-- Claims a K = 1 key for the calling pick. The advisory lock serialises pickers of
-- one key; the check runs after it with a fresh snapshot (VOLATILE), so it sees
-- any claim committed by the picker that held the lock before us.
CREATE OR REPLACE FUNCTION claim_key(k text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext(current_schema() || ':k1'), hashtext(k)) THEN
        RETURN false;
    END IF;
    RETURN NOT EXISTS (
        SELECT 1 FROM instances
        WHERE status = 'executing' AND concurrency_key = k AND gate_shard IS NULL);
END
$$;
