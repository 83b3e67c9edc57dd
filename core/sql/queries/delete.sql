-- Delete the instances filter $1..$6 names, up to $8 after id $7 (see
-- matching), with the signals kept for them; not one that is executing or
-- reserved by a node (cancel it first). Returns each instance named, the
-- status it had and whether it was deleted.
WITH prev AS (
    SELECT id, status, node FROM __S__.instances
    WHERE id IN (SELECT __S__.matching($1, $2, $3, $4, $5, $6, $7, $8))
    FOR UPDATE
), gone AS (
    DELETE FROM __S__.instances i USING prev p
    WHERE i.id = p.id AND p.status <> 'executing' AND p.node IS NULL
    RETURNING i.id
), letters AS (
    DELETE FROM __S__.mailbox WHERE instance IN (SELECT id FROM gone)
)
SELECT p.id, p.status, EXISTS (SELECT 1 FROM gone g WHERE g.id = p.id) AS changed
FROM prev p ORDER BY p.id
