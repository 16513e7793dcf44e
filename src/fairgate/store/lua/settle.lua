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
--
-- The reservation and the use are netted per bucket, as the SQLite driver does: a bucket gets
-- one write of (use - reserved), none when the estimate was exact (a request's 1), instead of
-- the reservation's undo and then the use's add. The arithmetic is the SQLite driver's
-- (_settle, _apply_delta): the net is (0 - reserved) + used, added when above 0, taken off
-- (clamped at 0, a missing bucket left missing) when below.

local now = tonumber(ARGV[1])
local settle = ARGV[2] == 'settle'
local rid = ARGV[3]
local n = tonumber(ARGV[5])

-- bucket key -> net change, in the order first seen, and each bucket's window
local order, net, windows = {}, {}, {}
local function change(key, amount, window_ms)
  local old = net[key]
  if old == nil then
    order[#order + 1] = key
    windows[key] = window_ms
    old = 0
  end
  net[key] = old + amount
end

local held = false
if settle then
  local raw = redis.call('GET', KEYS[2])
  if raw == SETTLED then
    return 2
  end
  if raw then
    held = true
    -- as drop_reservation: only the parts whose bucket still counts (current or previous)
    for _, p in ipairs(cjson.decode(raw)['p']) do
      local w = tonumber(p[3])
      if tonumber(p[4]) >= math.floor(now / w) - 1 then
        change(p[1], -tonumber(p[2]), w)
      end
    end
    redis.call('SET', KEYS[2], SETTLED, 'PX', tonumber(ARGV[6]))
  end
  redis.call('ZREM', KEYS[1], rid)
end

-- the pool's shared keys live as long as its longest window's buckets (plus a minute)
local ttl = 60000
for i = 1, n do
  local w2 = 2 * tonumber(ARGV[7 + 4 * (i - 1)]) + 60000
  if w2 > ttl then
    ttl = w2
  end
end

local fields, amounts = {}, {}
for i = 1, n do
  local a = 7 + 4 * (i - 1)
  local w = tonumber(ARGV[a])
  local amount = tonumber(ARGV[a + 1])
  if amount ~= 0 then
    local k = 5 + 2 * (i - 1)
    change(KEYS[k], amount, w)
    -- Only pool-scope use counts for the pool total and its cumulative total; a model cap's
    -- counter is this key's alone.
    if ARGV[a + 2] == 'pool' then
      change(KEYS[k + 1], amount, w)
      fields[#fields + 1] = ARGV[a + 3]
      amounts[#amounts + 1] = amount
    end
  end
end

for _, key in ipairs(order) do
  local d = net[key]
  if d > 0 then
    add_to(key, d, windows[key])
  elseif d < 0 then
    local old = redis.call('GET', key)
    if old then
      local v = tonumber(old) - -d
      if v < 0 then
        v = 0.0
      end
      redis.call('SET', key, fmt(v), 'PX', ms(2 * windows[key]))
    end
  end
end

-- the cumulative totals: one read and one write of every counter (added in the items' order)
if #fields > 0 then
  local olds = redis.call('HMGET', KEYS[3], unpack(fields))
  local sums, names = {}, {}
  for i, field in ipairs(fields) do
    local sum = sums[field]
    if sum == nil then
      names[#names + 1] = field
      sum = tonumber(olds[i] or '0')
    end
    sums[field] = sum + amounts[i]
  end
  local args = {}
  for _, field in ipairs(names) do
    args[#args + 1] = field
    args[#args + 1] = fmt(sums[field])
  end
  redis.call('HSET', KEYS[3], unpack(args))
  keep_for(KEYS[3], ttl)
end

if settle then
  redis.call('ZADD', KEYS[4], 'GT', now, ARGV[4])
  keep_for(KEYS[4], ttl)
end

if held then
  return 1
end
return 0
