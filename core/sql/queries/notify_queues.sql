-- Wake the pickers of queues $2 on channel $1.
SELECT pg_notify($1, q) FROM unnest($2::text[]) q
