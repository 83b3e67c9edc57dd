-- Rate-limit state idle for a minute: the next start mints it anew.
DELETE FROM __S__.rate_state WHERE key IN (
    SELECT key FROM __S__.rate_state WHERE tat < now() - interval '1 minute'
    LIMIT 10000 FOR UPDATE SKIP LOCKED)
