-- Instances for tests' assertions: of workflow $1, whose state contains $2
-- (jsonb @>; NULL: any), in queue $3 and status $4 (NULL: any), oldest
-- first, at most $5. Columns as instance_from_row reads them.
SELECT id, workflow, step, state, queue, priority, status, concurrency_key, rate_key, attempt,
       max_attempts, node, cancel_requested, await_signal, await_until, errors, inserted_at,
       scheduled_at, attempted_at, finished_at
FROM __S__.instances
WHERE workflow = $1
  AND ($2::jsonb IS NULL OR state @> $2::jsonb)
  AND ($3::text IS NULL OR queue = $3)
  AND ($4::text IS NULL OR status = $4)
ORDER BY id
LIMIT $5
