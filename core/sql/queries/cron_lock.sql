-- The schedule's last tick, locked until the transaction that inserts the
-- next ticks commits; with the database's clock.
SELECT last_tick, now() AS now FROM __S__.cron WHERE name = $1 FOR UPDATE
