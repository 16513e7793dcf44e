-- settle / record: replace a reservation (if any) with the actual use, in one atomic step.
-- record is settle without a reservation and without marking the key active.
--
-- KEYS[1] rz: ZSET reservation id -> expires_ms   KEYS[2] the reservation's key
-- KEYS[3] cum: HASH counter -> cumulative use     KEYS[4] act: ZSET key id -> last ms
-- KEYS[5 + 2*(i-1) ..] per usage item i: key's current bucket, pool total's current bucket
-- ARGV[1] now_ms  ARGV[2] 'settle' | 'record'  ARGV[3] reservation id  ARGV[4] key id
-- ARGV[5] number of items  ARGV[6] how long a settled reservation's marker lives (ms), then 4
-- per item: window_ms, amount, scope ('pool' | 'model'), counter
-- Returns 1 if a reservation was still held, 2 if it was settled already (nothing done), else 0.
--
-- A settle whose reply timed out is journaled and replayed, so it may arrive twice: the first
-- one leaves SETTLED in the reservation's key, and the second one finds it and adds nothing.

local now = tonumber(ARGV[1])
local settle = ARGV[2] == 'settle'
local rid = ARGV[3]
local n = tonumber(ARGV[5])

local held = false
if settle then
  if redis.call('GET', KEYS[2]) == SETTLED then
    return 2
  end
  held = drop_reservation(KEYS[2], now)
  redis.call('ZREM', KEYS[1], rid)
  if held then
    redis.call('SET', KEYS[2], SETTLED, 'PX', tonumber(ARGV[6]))
  end
end

-- the pool's shared keys live as long as its longest window's buckets (plus a minute)
local ttl = 60000
for i = 1, n do
  local w2 = 2 * tonumber(ARGV[7 + 4 * (i - 1)]) + 60000
  if w2 > ttl then
    ttl = w2
  end
end

for i = 1, n do
  local a = 7 + 4 * (i - 1)
  local w = tonumber(ARGV[a])
  local amount = tonumber(ARGV[a + 1])
  if amount ~= 0 then
    local k = 5 + 2 * (i - 1)
    add_to(KEYS[k], amount, w)
    -- Only pool-scope use counts for the pool total and its cumulative total; a model cap's
    -- counter is this key's alone.
    if ARGV[a + 2] == 'pool' then
      add_to(KEYS[k + 1], amount, w)
      local field = ARGV[a + 3]
      local old = tonumber(redis.call('HGET', KEYS[3], field) or '0')
      redis.call('HSET', KEYS[3], field, fmt(old + amount))
      keep_for(KEYS[3], ttl)
    end
  end
end

if settle then
  redis.call('ZADD', KEYS[4], 'GT', now, ARGV[4])
  keep_for(KEYS[4], ttl)
end

if held then
  return 1
end
return 0
