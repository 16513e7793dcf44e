-- anchor: compare-and-set one counter's provider-anchored window (redis.py set_anchor). The
-- re-anchoring rule itself is Python's (fairgate.quota.window.reanchor, the one place it is
-- written): the caller read the field, computed the new value, and writes it only if nobody
-- changed it meanwhile (another replica applying a reading); otherwise it reads again.
--
-- KEYS[1] "<prefix>:{<pool>}:anchor": HASH counter -> "<reset_ms>|<bucket index>|<source>"
-- ARGV[1] counter  ARGV[2] the value read ('' = none)  ARGV[3] the new value
-- ARGV[4] TTL ms of the hash (never shortened)
-- Returns 1 if written, 0 if the field had changed.

local seen = redis.call('HGET', KEYS[1], ARGV[1]) or ''
if seen ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
keep_for(KEYS[1], tonumber(ARGV[4]))
return 1
