-- slot_acquire: take one of a connection's `max_concurrent` slots, shared by every replica.
--
-- KEYS[1] ZSET lease id -> expires_ms (hash-tagged per connection)
-- ARGV[1] now_ms  ARGV[2] cap  ARGV[3] lease id  ARGV[4] lease ttl ms
-- Returns 1 (the lease is held until now_ms + ttl, or its release) or 0 (cap leases are held).
-- Time comes from the caller's clock, never Redis TIME, like the quota scripts: one clock for
-- the whole gateway, and tests can move it.

local now = tonumber(ARGV[1])
local ttl = tonumber(ARGV[4])
-- a lease whose holder died (no release, no renewal) gives its slot back here
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[3])
-- the ZSET itself goes once nothing can be held in it any more (a garbage collector only: the
-- expiry that counts is each lease's score)
redis.call('PEXPIRE', KEYS[1], 2 * ttl)
return 1
