SELECT unparked, last_key, next_in, own_woken FROM __S__.rate_sweep($1, $2, $3, $4, $5, $6, $7, $8, $9)
