SELECT g.key,
       (SELECT count(*) FROM __S__.instances i
        WHERE i.status = 'executing' AND i.concurrency_key = g.key AND i.gate_shard IS NOT NULL),
       sum(g.capacity)::bigint, sum(g.available)::bigint, count(*)
FROM __S__.gate_slots g GROUP BY g.key ORDER BY g.key
