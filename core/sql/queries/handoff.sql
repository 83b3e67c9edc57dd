-- Outcomes, handovers and claims (see sql/functions/handoff.sql).
SELECT (claimed).*, reserved, written, released, handed_over, released_keys, promoted
FROM __S__.handoff($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)
