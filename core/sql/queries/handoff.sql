-- Outcomes, handovers and claims (see sql/functions/handoff.sql). On the
-- header row, `rate_parked`: the rows the call's picks parked for their rate
-- limit, which each pick adds to a setting local to the transaction (this
-- statement is one: it runs on its own). The function has run to its end
-- before the first row is projected, so the header reads the total.
SELECT (claimed).*, reserved, written, released, handed_over, released_keys, promoted,
       CASE WHEN reserved IS NULL
            THEN coalesce(nullif(current_setting('gendurable.rate_parked', true), '')::bigint, 0)
       END AS rate_parked
FROM __S__.handoff($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
                   $19, $20, $21, $22)
