-- Pause queue $1 (no node claims from it until it is resumed); returns
-- whether it was running.
WITH p AS (
    INSERT INTO __S__.queue_pauses (queue) VALUES ($1) ON CONFLICT (queue) DO NOTHING RETURNING 1
)
SELECT count(*) > 0 FROM p
