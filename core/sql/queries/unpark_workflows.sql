-- $1 queues, $2 workflows (a node's), $3 rows per pair, $4 channel.
SELECT __S__.unpark_workflows($1, $2, $3, $4)
