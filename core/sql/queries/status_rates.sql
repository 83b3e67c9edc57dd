SELECT key, tat FROM __S__.rate_state ORDER BY key LIMIT 1000
