-- Helpers shared by every fairgate quota script. redis.py prepends this file to every script
-- (admit.lua, settle.lua, release.lua, and the slot_*.lua and log_append.lua ones, which use
-- none of it), so the reclaim arithmetic exists once.
--
-- Counters are plain strings holding a double printed with '%.17g' (exact round trip) and
-- updated with GET + SET inside the script, not INCRBYFLOAT: INCRBYFLOAT adds in long double and
-- prints 17 fixed decimals (0.1 + 0.2 -> "0.3"), so Redis sums would drift from the SQLite
-- driver's IEEE doubles (0.30000000000000004). Lua numbers are the same doubles as Python floats,
-- so both drivers hold bit-identical counts. The script is atomic, so GET + SET is as safe as
-- INCRBYFLOAT.
--
-- A whole count (a request count, most token counts) is printed with '%d': the same digits as
-- '%.17g' gives below 1e15, without glibc's arbitrary-precision digit generation (its
-- printf_fp and strtod were 16 % of redis-server's instructions per request). Zero and
-- fractions take '%.17g' (it keeps the sign of -0.0 and every bit of a fraction).
local function fmt(x)
  if x >= 1 and x < 1e15 and x == math.floor(x) then
    return string.format('%d', x)
  end
  return string.format('%.17g', x)
end

-- A whole number of milliseconds (a TTL, a score) as the text a command takes. Lua would turn a
-- number argument of redis.call into text with '%.14g', glibc's slow path again.
local function ms(x)
  return string.format('%d', x)
end

-- Set a counter bucket to `old` (its value as read, a string) plus `amount` (a number) and give
-- it a TTL of 2 x its window (refreshed on every write): a bucket is read while it is current or
-- previous, never after.
local function set_sum(key, old, amount, window_ms)
  redis.call('SET', key, fmt(tonumber(old) + amount), 'PX', ms(2 * window_ms))
end

-- Add `amount` (a number) to a counter bucket (see set_sum).
local function add_to(key, amount, window_ms)
  set_sum(key, redis.call('GET', key) or '0', amount, window_ms)
end

-- Give a ZSET or HASH that many writes share (reservations, active keys, cumulative totals) a TTL
-- of at least `ttl_ms` after every write: never shortened (a monthly reservation must outlive an
-- hourly one), set when the key has none. Every key fairgate writes expires, so nothing outlives
-- its use. Once what is left falls below `ttl_ms`, it is set to 2 x `ttl_ms`: the next writes
-- of that stretch cost one PTTL each, not a PTTL and a PEXPIRE (a hot pool's every admission
-- and settle writes these keys; one command in three of a request's was this refresh).
local function keep_for(key, ttl_ms)
  if redis.call('PTTL', key) < ttl_ms then
    redis.call('PEXPIRE', key, ms(2 * ttl_ms))
  end
end

-- Undo a reservation: subtract each part from its bucket while that bucket still counts (current
-- or previous for its window). An older bucket is no longer read and may have expired; a missing
-- bucket (expired, or the pool was cleared) is skipped too, so no negative key is ever created.
-- The clamp at 0 (as in the SQLite driver) only absorbs float residue (0.1 + 0.2 - 0.1 - 0.2).
-- Parts are {bucket key, amount, window_ms, bucket index}; admit.lua wrote those bucket keys
-- under the same pool hash tag as the reservation. Returns true if the reservation was held.
-- A settled reservation's key holds SETTLED for a while (settle.lua): not a reservation any more.
local SETTLED = 'settled'

local function drop_reservation(rkey, now)
  local raw = redis.call('GET', rkey)
  if not raw or raw == SETTLED then
    return false
  end
  local res = cjson.decode(raw)
  for _, p in ipairs(res['p']) do
    local w = tonumber(p[3])
    if tonumber(p[4]) >= math.floor(now / w) - 1 then
      local old = redis.call('GET', p[1])
      if old then
        local v = tonumber(old) - tonumber(p[2])
        if v < 0 then
          v = 0.0
        end
        redis.call('SET', p[1], fmt(v), 'PX', ms(2 * w))
      end
    end
  end
  redis.call('DEL', rkey)
  return true
end
