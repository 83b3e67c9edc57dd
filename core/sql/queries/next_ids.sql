-- $1 ids for a COPY, in order (see insert::copy). Materialised: inlined, the
-- sequence's name is looked up per row.
WITH q AS MATERIALIZED (SELECT pg_get_serial_sequence('__S__.instances', 'id')::regclass AS s)
SELECT nextval(s) FROM q, generate_series(1, $1)
