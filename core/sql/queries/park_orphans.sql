-- $1 queue, $2 lease in seconds, $3 rows at the head to look at.
SELECT __S__.park_orphans($1, $2, $3)
