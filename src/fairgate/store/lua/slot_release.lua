-- slot_release: give a slot back.
--
-- KEYS[1] ZSET lease id -> expires_ms   ARGV[1] lease id
-- Returns 1 if the lease was still held, else 0 (it had expired and been reaped).

return redis.call('ZREM', KEYS[1], ARGV[1])
