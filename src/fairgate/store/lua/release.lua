-- release: drop a reservation on failure, timeout or disconnect; its parts are taken back from
-- the buckets they were added to (while those are still read).
--
-- KEYS[1] rz: ZSET reservation id -> expires_ms   KEYS[2] the reservation's key
-- ARGV[1] now_ms  ARGV[2] reservation id
-- Returns 1 if the reservation was still held, else 0.

local held = drop_reservation(KEYS[2], tonumber(ARGV[1]))
redis.call('ZREM', KEYS[1], ARGV[2])
if held then
  return 1
end
return 0
