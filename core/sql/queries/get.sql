-- One instance, its columns in the order instance_from_row reads them.
SELECT id, workflow, step, state, queue, priority, status, concurrency_key, rate_key, attempt,
       max_attempts, node, cancel_requested, await_signal, await_until, errors, inserted_at,
       scheduled_at, attempted_at, finished_at
FROM __S__.instances WHERE id = $1
