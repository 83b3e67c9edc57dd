-- Wake every instance awaiting signal $1 with payload $2; kept for $3
-- seconds when none was (NULL: not kept). See send_signal.
SELECT woken, kept FROM __S__.send_signal($1, $2, $3, $4)
