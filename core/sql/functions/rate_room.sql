-- The room each rate-limit key has for rows to wait unparked: the starts its
-- limit allows now (GCRA, as the pick computes it; a name not configured:
-- `lim`) minus the rows already waiting unparked, counted up to `lim`.
CREATE OR REPLACE FUNCTION rate_room(keys text[], lim integer,
                          rate_names text[], rate_intervals float8[], rate_tolerances float8[])
RETURNS TABLE (key text, room integer)
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT k.key, greatest(k.allowed
               - (SELECT count(*) FROM (SELECT 1 FROM instances a
                                         WHERE a.rate_key = k.key
                                           AND coalesce(a.parked, a.status) = 'available'
                                         LIMIT lim) x), 0)::integer
    FROM (SELECT d.key,
                 CASE WHEN d.ri IS NULL THEN lim
                      ELSE least(lim, coalesce(
                          (SELECT CASE WHEN greatest(rs.tat, now()) <= now() + make_interval(secs => rate_tolerances[d.ri])
                                       THEN floor((extract(epoch FROM now() - greatest(rs.tat, now()))::float8
                                                   + rate_tolerances[d.ri]) / rate_intervals[d.ri] + 1e-9)::integer + 1
                                       ELSE 0 END
                           FROM rate_state rs WHERE rs.key = d.key),
                          floor(rate_tolerances[d.ri] / rate_intervals[d.ri] + 1e-9)::integer + 1))
                 END AS allowed
          FROM (SELECT u.key, array_position(rate_names, split_part(u.key, ':', 1)) AS ri
                FROM (SELECT DISTINCT unnest(keys) AS key) u) d) k;
END
$$;
