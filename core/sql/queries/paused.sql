-- The paused queues and since when.
SELECT queue, paused_at FROM __S__.queue_pauses ORDER BY queue
