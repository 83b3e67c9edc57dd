-- The ($1 queue, $2 workflow) pairs whose rows no live node (within $3
-- seconds) will run.
SELECT q, w FROM unnest($1::text[], $2::text[]) AS p(q, w)
WHERE __S__.orphaned(q, w, $3)
