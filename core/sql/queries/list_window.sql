-- One window of the instance list: the instances filter $1..$6 names (as
-- in the matching function) with ids in [$9, $7), newest first, at most $8.
-- The id range bounds what one call reads, whatever the filter: the
-- primary key's range, however many rows the table holds.
SELECT i.id, i.workflow, i.step, i.queue, i.status, i.priority, i.concurrency_key, i.rate_key,
       i.attempt, i.max_attempts, i.node, i.parked, i.inserted_at, i.scheduled_at,
       i.finished_at, i.errors -> -1 ->> 'message'
FROM __S__.instances i
WHERE i.id < $7 AND i.id >= $9
  AND ($1::bigint[] IS NULL OR i.id = ANY ($1))
  AND ($2::text IS NULL OR i.workflow = $2)
  AND ($3::text IS NULL OR i.queue = $3)
  AND ($4::text[] IS NULL OR i.status = ANY ($4))
  AND ($5::text IS NULL OR i.concurrency_key = $5)
  AND ($6::text IS NULL OR strpos(lower(i.errors -> -1 ->> 'message'), lower($6)) > 0)
ORDER BY i.id DESC
LIMIT $8
