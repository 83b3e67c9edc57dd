-- Keys with parked rows, the most parked first; each with its rows waiting
-- unparked. Reads the parking indexes only.
WITH p AS (
    SELECT * FROM (
        SELECT concurrency_key AS key, 'key' AS kind, count(*) AS n FROM __S__.instances
        WHERE status = 'available' AND parked = 'key' GROUP BY 1
        UNION ALL
        SELECT rate_key, 'rate', count(*) FROM __S__.instances
        WHERE status = 'available' AND parked = 'rate' GROUP BY 1) x
    ORDER BY n DESC, key LIMIT 100)
SELECT p.key, p.kind, p.n,
       CASE p.kind
           WHEN 'key' THEN (SELECT count(*) FROM __S__.instances h
                            WHERE h.concurrency_key = p.key
                              AND coalesce(h.parked, h.status) = 'available')
           ELSE (SELECT count(*) FROM __S__.instances h
                 WHERE h.rate_key = p.key AND coalesce(h.parked, h.status) = 'available')
       END
FROM p ORDER BY p.n DESC, p.key
