-- The ids filter $1..$6 names after $7 (NULL: from the first), at most $8,
-- in id order (see the matching function).
SELECT m.id FROM __S__.matching($1, $2, $3, $4, $5, $6, $7, $8) AS m (id)
