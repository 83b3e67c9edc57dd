-- Whether the calling pick may mint the GCRA state of a rate-limit key:
-- nobody else is minting it right now and none exists yet (as may_mint_gate).
CREATE OR REPLACE FUNCTION may_mint_rate(k text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext(current_schema() || ':rate'), hashtext(k)) THEN
        RETURN false;
    END IF;
    RETURN NOT EXISTS (SELECT 1 FROM rate_state WHERE key = k);
END
$$;
