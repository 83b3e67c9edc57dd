-- $1 keys, $2/$3 gate names and limits.
SELECT key, room FROM __S__.insert_room($1, $2, $3)
