-- admit: reclaim expired reservations, read every check, decide, reserve: one atomic step.
-- Mirrors fairgate.quota.decision.evaluate line for line (a parity test holds them together).
--
-- KEYS[1]  "<prefix>:{<pool>}"; carries the pool's hash tag. Keys of reclaimed reservations are
--          built from it (KEYS[1] .. ':r:' .. id) and their parts name bucket keys admit.lua wrote
--          earlier; all share the hash tag of KEYS[1], so they live in its cluster slot.
-- KEYS[2]  rz: ZSET reservation id -> expires_ms
-- KEYS[3]  act: ZSET key id -> last admission ms
-- KEYS[4]  this reservation's key
-- KEYS[5 + 4*(i-1) ..] per check i: total prev, total curr, key prev, key curr
-- ARGV[1] now_ms  ARGV[2] key id  ARGV[3] reservation id  ARGV[4] policy code (POLICY_CODES)
-- ARGV[5] threshold  ARGV[6] lease_ms  ARGV[7] reservation TTL ms  ARGV[8] reclaim batch
-- ARGV[9] number of checks, then 10 per check: first what the pool's configuration fixes (the
--         store packs these once): scope ('pool' | 'model'), window_ms, limit, cap ('' = none),
--         anchored (1: the window is anchored to the provider's reset and the caller chose its
--         bucket keys; a count is then its current bucket alone, window.Count.value),
--         window_share (1: the fair share is judged on the key's current bucket,
--         DimensionCheck.window_share); then what each admission computes: fair_share, cost,
--         signal, reserve
-- ARGV[10 + 10*n ..] the hold of a pool that holds requests (section 2b), '' = none
-- Returns {outcome (0 allow, 1 penalize, 2 block), reason code (REASON_CODES index),
--          blocking index (0-based, -1 none), then per check the raw strings of
--          total prev, total curr, key prev, key curr, then waiting (1: held in the queue
--          now) and full (1: the key's queue, 2: the pool's)} -- strings, so floats survive the reply
--          (Redis would truncate a Lua number to an integer). {-1} if the id is already held
--          (whatever the verdict would be): nothing is written then but the reclaim.

local now = tonumber(ARGV[1])
local key_id = ARGV[2]
local rid = ARGV[3]
local policy = tonumber(ARGV[4])
local threshold = tonumber(ARGV[5])
local lease_ms = tonumber(ARGV[6])
local res_ttl = tonumber(ARGV[7])
local n = tonumber(ARGV[9])

local HARD, SOFT = 0, 1
local CAP_ABSOLUTE, GLOBAL_SATURATED, FAIR_SHARE, MODEL_CAP = 1, 2, 3, 4

-- 1. Reclaim a bounded batch of expired reservations of this pool.
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, ARGV[8])
for _, id in ipairs(expired) do
  drop_reservation(KEYS[1] .. ':r:' .. id, now)
  redis.call('ZREM', KEYS[2], id)
end

-- 2. Read and decide. This reservation's key (is the id held already?) and every bucket in one
-- MGET (a model-scope check's pool-total keys are read too and ignored: that check never reads
-- nor writes the pool total). Read after the reclaim, as the id's own expired reservation is
-- gone by then.
local read = redis.call('MGET', unpack(KEYS, 4, 4 + 4 * n))
local held = read[1]
local checks = {}
local raw = {}
for i = 1, n do
  local a = 10 + 10 * (i - 1)
  local k = 5 + 4 * (i - 1)
  local r = 1 + 4 * (i - 1)
  -- As in the SQLite driver: the pool total is read and written for scope 'pool' only, and
  -- evaluate() applies the model rule for scope 'model' only.
  local scope = ARGV[a]
  local pool = scope == 'pool'
  local tp, tc = '0', '0'
  if pool then
    tp = read[r + 1] or '0'
    tc = read[r + 2] or '0'
  end
  local kp = read[r + 3] or '0'
  local kc = read[r + 4] or '0'
  local window = tonumber(ARGV[a + 1])
  -- window.sliding_value: prev * (1 - elapsed / W) + curr, elapsed = now - floor(now / W) * W
  local frac = 0.0
  if ARGV[a + 4] ~= '1' then
    frac = 1.0 - (now - math.floor(now / window) * window) / window
  end
  local kcn = tonumber(kc)
  local mine = tonumber(kp) * frac + kcn
  local cap = ARGV[a + 3]
  checks[i] = {
    pool = pool,
    model = scope == 'model',
    window = window,
    window_s = ARGV[a + 1],
    limit = tonumber(ARGV[a + 2]),
    cap = cap ~= '' and tonumber(cap) or nil,
    fair_share = tonumber(ARGV[a + 6]),
    cost_s = ARGV[a + 7],
    cost = tonumber(ARGV[a + 7]),
    signal = tonumber(ARGV[a + 8]),
    reserve = tonumber(ARGV[a + 9]),
    tkey = KEYS[k + 1],
    kkey = KEYS[k + 3],
    -- what the current buckets hold, for the reservation's writes (nothing writes them between)
    tc = tc,
    kc = kc,
    total = tonumber(tp) * frac + tonumber(tc),
    mine = mine,
    -- what the fair share is judged on: the key's current window, or its sliding count
    share_use = ARGV[a + 5] == '1' and kcn or mine,
  }
  raw[#raw + 1] = tp
  raw[#raw + 1] = tc
  raw[#raw + 1] = kp
  raw[#raw + 1] = kc
end

local function evaluate()
  local penalized = false
  for i, c in ipairs(checks) do
    local total, mine = c.total, c.mine
    if c.model then
      if mine >= c.limit then
        return 2, MODEL_CAP, i - 1
      end
    else
      if c.cap ~= nil and mine >= c.cap then
        return 2, CAP_ABSOLUTE, i - 1
      end
      local limit = c.limit
      if total >= limit or total + c.cost > limit then
        return 2, GLOBAL_SATURATED, i - 1
      end
      -- into room owed to keys waiting further below their share (active mode): refused
      -- whatever the policy (issue 45)
      if c.reserve > 0 and total + c.cost + c.reserve > limit then
        return 2, FAIR_SHARE, i - 1
      end
      -- Python's max(a, b) keeps a unless b > a; so does this.
      local used = total / limit
      if c.signal > used then
        used = c.signal
      end
      if used >= threshold then -- strict
        if policy == HARD and c.share_use >= c.fair_share then
          return 2, FAIR_SHARE, i - 1
        end
        if policy == SOFT and c.share_use >= c.fair_share then
          penalized = true
        end
      else -- generous: borrow up to the limit
        if policy == HARD and mine >= limit then
          return 2, GLOBAL_SATURATED, i - 1
        end
        if policy == SOFT and c.share_use >= c.fair_share then
          penalized = true
        end
      end
    end
  end
  if penalized then
    return 1, 0, -1
  end
  return 0, 0, -1
end

-- Checked before deciding: the engine retries an admission whose reply timed out under the same
-- id, and must learn that the first attempt reserved even when the pool is full by now.
if held then
  return { -1 }
end

local outcome, reason, index = evaluate()

-- 2b. The queue of a pool that holds requests (admission: hold; fairgate.quota.queue and
-- quota.hold mirrored line for line). ARGV after the checks: waiter id ('' = the pool does not
-- hold), enqueued ms, deadline ms, the key's weight, the queue limits per key and per pool.
-- The waiters are a HASH KEYS[1] .. ':w' (same hash tag): id -> "key\tenqueued\tdeadline\t
-- share\towed". Every replica admits through this script, so every one sees every waiter.
local waiting, full = 0, 0
local h = 10 + 10 * n
local wid = ARGV[h] or ''
if wid ~= '' then
  local wkey = KEYS[1] .. ':w'
  local enq = tonumber(ARGV[h + 1])
  local deadline = tonumber(ARGV[h + 2])
  local weight = tonumber(ARGV[h + 3])
  -- quota.hold.dominant_share: the largest use / limit over the pool checks, per weight
  local share = 0.0
  for _, c in ipairs(checks) do
    if c.pool and c.limit > 0 then
      local s = c.mine / c.limit
      if s > share then
        share = s
      end
    end
  end
  if weight <= 0 then
    share = math.huge
  else
    share = share / weight
  end
  -- the live waiters; those out of patience are forgotten
  local flat = redis.call('HGETALL', wkey)
  local live = {}
  for j = 1, #flat, 2 do
    local k, e, d, s, o = string.match(flat[j + 1], '^(.-)\t(%d+)\t(%d+)\t([^\t]+)\t(%d)$')
    if d == nil or tonumber(d) <= now then
      redis.call('HDEL', wkey, flat[j])
    else
      local ws = tonumber(s)
      if s == 'inf' then
        ws = math.huge
      end
      live[#live + 1] = { id = flat[j], key = k, enq = tonumber(e), share = ws, owed = o == '1' }
    end
  end
  -- quota.hold.rank: the least share first, then the oldest, then the id
  local function before(s1, e1, i1, s2, e2, i2)
    if s1 ~= s2 then
      return s1 < s2
    end
    if e1 ~= e2 then
      return e1 < e2
    end
    return i1 < i2
  end
  local owed = reason == GLOBAL_SATURATED
  local holdable = owed or reason == FAIR_SHARE
  local blocked = outcome == 2
  if not blocked then
    -- quota.hold.jumps_queue: an owed waiter ranked before this admission keeps the room
    for _, w in ipairs(live) do
      if w.id ~= wid and w.owed then
        local ws = w.share
        if w.key == key_id then
          ws = share
        end
        if before(ws, w.enq, w.id, share, enq, wid) then
          blocked, owed, holdable = true, true, true
          break
        end
      end
    end
    if blocked then
      outcome, reason, index = 2, GLOBAL_SATURATED, 0
      for i, c in ipairs(checks) do
        if c.pool then
          index = i - 1
          break
        end
      end
    end
  end
  local join = false
  if blocked and holdable and deadline > now then
    -- quota.hold.queue_full
    local of_key, of_pool = 0, 0
    for _, w in ipairs(live) do
      if w.id ~= wid then
        of_pool = of_pool + 1
        if w.key == key_id then
          of_key = of_key + 1
        end
      end
    end
    if of_key >= tonumber(ARGV[h + 4]) then
      full = 1
    elseif of_pool >= tonumber(ARGV[h + 5]) then
      full = 2
    else
      join = true
    end
  end
  if join then
    local o = '0'
    if owed then
      o = '1'
    end
    redis.call('HSET', wkey, wid, key_id .. '\t' .. ARGV[h + 1] .. '\t' .. ARGV[h + 2] .. '\t'
      .. string.format('%.17g', share) .. '\t' .. o)
    keep_for(wkey, deadline - now + 1000)
    waiting = 1
  else
    redis.call('HDEL', wkey, wid)
  end
end

-- 3. The key was active now, even if it is blocked (GT: a late clock never moves it back).
redis.call('ZADD', KEYS[3], 'GT', ARGV[1], key_id)
keep_for(KEYS[3], res_ttl)

-- 4. Reserve: add each cost to the current bucket (pool total only for pool scope) and remember
-- the parts so settle/release/reclaim can take exactly them back.
if outcome ~= 2 then
  local parts = {}
  for _, c in ipairs(checks) do
    if c.cost ~= 0 then
      -- the epoch-aligned index even for an anchored window: drop_reservation only asks whether
      -- the bucket may still count (within one window of now), and for the current anchored
      -- window that holds as it does for the current epoch bucket
      local bucket = ms(math.floor(now / c.window))
      local w = c.window_s
      set_sum(c.kkey, c.kc, c.cost, c.window)
      parts[#parts + 1] = { c.kkey, c.cost_s, w, bucket }
      if c.pool then
        set_sum(c.tkey, c.tc, c.cost, c.window)
        parts[#parts + 1] = { c.tkey, c.cost_s, w, bucket }
      end
    end
  end
  redis.call('SET', KEYS[4], cjson.encode({ k = key_id, p = parts }), 'PX', ARGV[7])
  redis.call('ZADD', KEYS[2], ms(now + lease_ms), rid)
  keep_for(KEYS[2], res_ttl)
end

local out = { outcome, reason, index }
for _, v in ipairs(raw) do
  out[#out + 1] = v
end
out[#out + 1] = waiting
out[#out + 1] = full
return out
