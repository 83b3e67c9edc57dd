-- $1 rate keys, $2 most rows to count, $3/$4/$5 rate-limit names, intervals
-- and tolerances.
SELECT key, room FROM __S__.rate_room($1, $2, $3, $4, $5)
