SELECT queue, status, count(*) FROM __S__.instances GROUP BY 1, 2 ORDER BY 1, 2
