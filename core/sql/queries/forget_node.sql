-- A stopping node leaves: its row, and the rows it reserved go back.
WITH gone AS (DELETE FROM __S__.nodes WHERE id = $1 RETURNING 1)
SELECT __S__.release_reserved($1, NULL, NULL)
