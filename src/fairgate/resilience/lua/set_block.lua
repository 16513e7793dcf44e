-- set_block: merge a cooldown or a model lockout into its hash without ever shortening it.
-- Deadlines are absolute epoch ms from the caller's clock (never Redis TIME), so every gateway
-- replica and a restarted process agree on when a block ends.
--
-- KEYS[1] the block's HASH {until, level, reason, updated}
-- KEYS[2] idx: ZSET index member -> forget_ms (what the health snapshot lists)
-- ARGV[1] now_ms  ARGV[2] until_ms  ARGV[3] level  ARGV[4] reason  ARGV[5] level memory ms
-- ARGV[6] the index member
-- KEYS[3] version counter, ARGV[7] its channel: a write bumps the counter and publishes it, so
--         every replica drops its cached reads (see RedisResilienceStore.start_watch)
-- Returns {until_ms, level, reason} as stored: the later deadline (with its reason) and the
-- higher level. The key lives until the deadline plus the level memory, so the next failure
-- continues the backoff; a record past that is treated as absent even before Redis drops it.

local function fmt(x)
  return string.format('%.0f', x)
end

local now = tonumber(ARGV[1])
local until_ms = tonumber(ARGV[2])
local level = tonumber(ARGV[3])
local reason = ARGV[4]
local memory = tonumber(ARGV[5])

local old = redis.call('HMGET', KEYS[1], 'until', 'level', 'reason')
if old[1] then
  local old_until = tonumber(old[1])
  if old_until + memory > now then
    if old_until >= until_ms then
      until_ms = old_until
      reason = old[3]
    end
    local old_level = tonumber(old[2])
    if old_level > level then
      level = old_level
    end
  end
end

local forget = until_ms + memory
if forget > now then
  redis.call('HSET', KEYS[1], 'until', fmt(until_ms), 'level', fmt(level), 'reason', reason,
    'updated', fmt(now))
  redis.call('PEXPIRE', KEYS[1], fmt(forget - now))
  redis.call('ZADD', KEYS[2], fmt(forget), ARGV[6])
  redis.call('PUBLISH', ARGV[7], redis.call('INCR', KEYS[3]))
end
return {fmt(until_ms), fmt(level), reason}
