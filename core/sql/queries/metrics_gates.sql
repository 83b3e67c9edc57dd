-- Per gate name: slots in use and slots in all, over its keys' counters.
SELECT split_part(key, ':', 1) AS name, sum(capacity - available)::bigint AS in_flight,
       sum(capacity)::bigint AS capacity, count(DISTINCT key) AS keys
FROM __S__.gate_slots GROUP BY 1 ORDER BY 1
