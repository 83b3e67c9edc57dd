SELECT unparked, last_key FROM __S__.unpark_sweep($1, $2, $3, $4, $5)
