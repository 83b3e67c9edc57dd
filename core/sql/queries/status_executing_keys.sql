SELECT concurrency_key FROM __S__.instances
WHERE status = 'executing' AND concurrency_key IS NOT NULL AND gate_shard IS NULL
ORDER BY attempted_at LIMIT 100
