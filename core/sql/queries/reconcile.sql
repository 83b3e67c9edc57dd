-- $1 after, $2 keys, $3/$4/$5 gate names, limits and shards, $6 channel.
SELECT changed, last_key FROM __S__.reconcile_gates($1, $2, $3, $4, $5, $6)
