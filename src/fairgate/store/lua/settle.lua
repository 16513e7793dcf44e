-- settle / record, one or many of one pool: each replaces its reservation (if any) with the
-- actual use, in order, in one atomic step. record is settle without a reservation and without
-- marking the key active.
--
-- KEYS[1] rz: ZSET reservation id -> expires_ms   KEYS[2] cum: HASH counter -> cumulative use
-- KEYS[3] act: ZSET key id -> last ms, then per settle: its reservation's key, then 2 per usage
-- item: the key's current bucket, the pool total's current bucket
-- ARGV[1] how long a settled reservation's marker lives (ms)  ARGV[2] number of settles, then
-- per settle: now_ms, 'settle' | 'record', reservation id, key id, number of items, then 4 per
-- item: window_ms, amount, scope ('pool' | 'model'), counter
-- Returns per settle 1 if a reservation was still held, 2 if it was settled already (nothing
-- done for it), else 0.
--
-- A settle whose reply timed out is journaled and replayed, so it may arrive twice: the first
-- one leaves SETTLED in the reservation's key, and the second one finds it and adds nothing.
--
-- Each settle's reservation and use are netted per bucket, as the SQLite driver does: a bucket
-- gets one change of (use - reserved), none when the estimate was exact (a request's 1), instead
-- of the reservation's undo and then the use's add. The arithmetic is the SQLite driver's
-- (_settle, _apply_delta): the net is (0 - reserved) + used, added when above 0, taken off
-- (clamped at 0, a missing bucket left missing) when below.
--
-- Why several at once (redis.py batches the settles of a pool that wait while one is in flight):
-- the settles are applied one after the other with the same arithmetic as one at a time, but
-- every counter, the cumulative totals and the pool's shared keys are read once and written once
-- for the batch, and the call's own cost (about a fifth of a settle's) is paid once.

local count = tonumber(ARGV[2])

-- the batch's view of the counters it changes: bucket key -> value (false: missing), read on
-- first use and written once at the end, in the order first changed
local value, window_of, dirty, changed = {}, {}, {}, {}
local function current(key, window_ms)
  local v = value[key]
  if v == nil then
    local old = redis.call('GET', key)
    v = old and tonumber(old) or false
    value[key] = v
    window_of[key] = window_ms
  end
  return v
end
local function store(key, v)
  if not dirty[key] then
    dirty[key] = true
    changed[#changed + 1] = key
  end
  value[key] = v
end

local adds, add_names = {}, {} -- cumulative totals: counter -> its amounts, in order
local function add(field, amount)
  local list = adds[field]
  if list == nil then
    list = {}
    adds[field] = list
    add_names[#add_names + 1] = field
  end
  list[#list + 1] = amount
end

-- one settle's net change per bucket key, in the order first seen, and each bucket's window
local order, net, windows
local function change(key, amount, window_ms)
  local old = net[key]
  if old == nil then
    order[#order + 1] = key
    windows[key] = window_ms
    old = 0
  end
  net[key] = old + amount
end

local active = {} -- ZADD arguments: now, key id per settle
local settled = {} -- reservation ids to drop from rz
local ttl = 60000 -- the pool's shared keys live as long as its longest window's buckets + 1 min
local out = {}
local a, k = 3, 4
for s = 1, count do
  local now_ms = ARGV[a]
  local settle = ARGV[a + 1] == 'settle'
  local n = tonumber(ARGV[a + 4])
  local rkey = KEYS[k]
  local raw = settle and redis.call('GET', rkey) or nil
  if raw == SETTLED then
    out[s] = 2
    a = a + 5 + 4 * n
  else
    order, net, windows = {}, {}, {}
    out[s] = 0
    if settle then
      if raw then
        out[s] = 1
        -- as drop_reservation: only the parts whose bucket still counts (current or previous)
        local now = tonumber(now_ms)
        for _, p in ipairs(cjson.decode(raw)['p']) do
          local w = tonumber(p[3])
          if tonumber(p[4]) >= math.floor(now / w) - 1 then
            change(p[1], -tonumber(p[2]), w)
          end
        end
        redis.call('SET', rkey, SETTLED, 'PX', ARGV[1])
      end
      settled[#settled + 1] = ARGV[a + 2]
      active[#active + 1] = now_ms
      active[#active + 1] = ARGV[a + 3]
    end
    a = a + 5
    for i = 1, 2 * n, 2 do
      local w = tonumber(ARGV[a])
      if 2 * w + 60000 > ttl then
        ttl = 2 * w + 60000
      end
      local amount = tonumber(ARGV[a + 1])
      if amount ~= 0 then
        change(KEYS[k + i], amount, w)
        -- Only pool-scope use counts for the pool total and its cumulative total; a model
        -- cap's counter is this key's alone.
        if ARGV[a + 2] == 'pool' then
          change(KEYS[k + i + 1], amount, w)
          add(ARGV[a + 3], amount)
        end
      end
      a = a + 4
    end
    for _, key in ipairs(order) do
      local d = net[key]
      if d > 0 then
        store(key, (current(key, windows[key]) or 0) + d)
      elseif d < 0 then
        local v = current(key, windows[key])
        if v then
          v = v - -d
          if v < 0 then
            v = 0.0
          end
          store(key, v)
        end
      end
    end
  end
  k = k + 1 + 2 * n
end

for _, key in ipairs(changed) do
  redis.call('SET', key, fmt(value[key]), 'PX', ms(2 * window_of[key]))
end
if #settled > 0 then
  redis.call('ZREM', KEYS[1], unpack(settled))
end
-- the cumulative totals: one read and one write of every counter, each amount added in the
-- order the settles and their items came
if #add_names > 0 then
  local olds = redis.call('HMGET', KEYS[2], unpack(add_names))
  local args = {}
  for i, field in ipairs(add_names) do
    local sum = tonumber(olds[i] or '0')
    for _, amount in ipairs(adds[field]) do
      sum = sum + amount
    end
    args[#args + 1] = field
    args[#args + 1] = fmt(sum)
  end
  redis.call('HSET', KEYS[2], unpack(args))
  keep_for(KEYS[2], ttl)
end
if #active > 0 then
  redis.call('ZADD', KEYS[3], 'GT', unpack(active))
  keep_for(KEYS[3], ttl)
end
return out
