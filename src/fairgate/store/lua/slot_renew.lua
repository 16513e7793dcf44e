-- slot_renew: push the expiry of leases still in use (a long stream) to now_ms + ttl.
--
-- KEYS[1] ZSET lease id -> expires_ms
-- ARGV[1] now_ms  ARGV[2] lease ttl ms  ARGV[3..] lease ids
-- Returns how many were renewed. A lease that already expired is not brought back (its slot
-- may have gone to another request meanwhile): the request keeps running, uncounted.

local now = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local renewed = 0
for i = 3, #ARGV do
  renewed = renewed + redis.call('ZADD', KEYS[1], 'XX', 'CH', now + ttl, ARGV[i])
end
if renewed > 0 then
  redis.call('PEXPIRE', KEYS[1], 2 * ttl)
end
return renewed
