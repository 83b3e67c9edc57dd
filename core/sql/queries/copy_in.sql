COPY __S__.instances (id, workflow, step, state, queue, priority, concurrency_key,
                      rate_key, max_attempts, status, parked) FROM STDIN
