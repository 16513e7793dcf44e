-- put_breaker: share a provider breaker transition; the newest transition (updated_ms) wins, so
-- replicas converge whatever order their writes arrive in.
--
-- KEYS[1] the breaker's HASH {state, until, cooldown, updated}   KEYS[2] idx ZSET
-- ARGV[1] now_ms  ARGV[2] state ('open' | 'closed')  ARGV[3] until_ms  ARGV[4] cooldown_ms
-- ARGV[5] updated_ms  ARGV[6] memory ms  ARGV[7] the index member
-- KEYS[3] version counter, ARGV[8] its channel: bumped and published when a record is stored
-- Returns 1 if stored, 0 if the stored record is as new or newer.

local function fmt(x)
  return string.format('%.0f', x)
end

local now = tonumber(ARGV[1])
local memory = tonumber(ARGV[6])
local updated = tonumber(ARGV[5])

local cur = redis.call('HMGET', KEYS[1], 'updated', 'until')
if cur[1] then
  local cur_updated = tonumber(cur[1])
  local remembered = math.max(cur_updated, tonumber(cur[2])) + memory > now
  if remembered and cur_updated >= updated then
    return 0
  end
end

local forget = math.max(tonumber(ARGV[3]), updated) + memory
if forget <= now then
  return 0
end
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'until', fmt(tonumber(ARGV[3])),
  'cooldown', fmt(tonumber(ARGV[4])), 'updated', fmt(updated))
redis.call('PEXPIRE', KEYS[1], fmt(forget - now))
redis.call('ZADD', KEYS[2], fmt(forget), ARGV[7])
redis.call('PUBLISH', ARGV[8], redis.call('INCR', KEYS[3]))
return 1
