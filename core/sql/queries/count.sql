-- How many instances filter $1..$6 names (see matching).
SELECT count(*) FROM __S__.matching($1, $2, $3, $4, $5, $6, NULL, NULL)
