UPDATE __S__.cron SET last_tick = $2 WHERE name = $1
