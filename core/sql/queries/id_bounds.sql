-- The lowest and highest instance ids (the primary key's ends).
SELECT min(id), max(id) FROM __S__.instances
