-- Steps per minute over the last hour, summed over nodes (see throughput_add).
SELECT minute, sum(started)::bigint, sum(failed)::bigint, sum(completed)::bigint
FROM __S__.throughput WHERE minute > now() - interval '1 hour'
GROUP BY 1 ORDER BY 1
