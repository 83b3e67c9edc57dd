-- What the database says node $1 holds: executing, or reserved. One branch
-- per partial index (a status list would match neither).
SELECT id, workflow, step, state, queue, attempt, max_attempts, concurrency_key,
       gate_shard, rate_key, wake, token, true AS executing
FROM __S__.instances WHERE node = $1 AND status = 'executing'
UNION ALL
SELECT id, workflow, step, state, queue, attempt, max_attempts, concurrency_key,
       gate_shard, rate_key, wake, token, false
FROM __S__.instances
WHERE node = $1 AND status = 'available' AND node IS NOT NULL
