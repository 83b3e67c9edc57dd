-- Whether the calling pick may mint the counters of a key (gate or rate limit):
-- nobody else is minting it right now and no counter exists yet.
CREATE OR REPLACE FUNCTION may_mint_gate(k text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext(current_schema() || ':gate'), hashtext(k)) THEN
        RETURN false;
    END IF;
    RETURN NOT EXISTS (SELECT 1 FROM gate_slots WHERE key = k);
END
$$;
