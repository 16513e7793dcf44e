-- clear_block: forget a cooldown or a model lockout (a success resets the backoff level).
--
-- KEYS[1] the block's HASH   KEYS[2] idx ZSET
-- ARGV[1] the index member
-- ARGV[2] unless_active_at: '' to clear unconditionally, else keep a block whose deadline is
--         still ahead of this instant (a late success must not cut a fresh cooldown short)
-- ARGV[3] forget_before: a deadline at or before this is already forgotten (level memory over)
-- KEYS[3] version counter, ARGV[4] its channel: bumped and published when a block is removed
-- Returns 1 if a remembered block was removed, else 0.

local u = redis.call('HGET', KEYS[1], 'until')
if not u then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 0
end
u = tonumber(u)
if ARGV[2] ~= '' and u > tonumber(ARGV[2]) then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('PUBLISH', ARGV[4], redis.call('INCR', KEYS[3]))
if u <= tonumber(ARGV[3]) then
  return 0
end
return 1
