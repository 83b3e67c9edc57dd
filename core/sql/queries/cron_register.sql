-- A schedule seen for the first time starts after its tick $2 (the latest
-- one already passed): ticks before a schedule existed are not missed ones.
INSERT INTO __S__.cron (name, last_tick) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING
