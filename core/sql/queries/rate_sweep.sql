SELECT unparked, last_key, next_in FROM __S__.rate_sweep($1, $2, $3, $4, $5, $6)
