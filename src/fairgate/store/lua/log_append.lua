-- log_append: one pool's admission events of a flush (store/admission_log.py), in one call:
-- each its own stream entry, then the stream bounded by length and by age, and given a TTL.
--
-- KEYS[1] the pool's stream
-- ARGV[1] per_pool  ARGV[2] max_age (ms)  ARGV[3 ..] the events (JSON), in order
-- Returns how many were added.
--
-- The age is measured on Redis's clock (TIME), the clock the entry ids are made of: a gateway
-- whose clock is shifted (the test clock) or skewed must not trim the entries it just wrote.
-- Trimming is approximate (~): Redis drops whole radix-tree nodes only, so a trim costs O(1)
-- amortised instead of a node rewrite per call; the stream may hold up to a node's worth
-- (stream-node-max-entries, 100) more than per_pool, and the reader shows per_pool at most.
-- The TTL, refreshed by every append, removes the stream of a pool nobody admits to any more
-- (or one deleted while Redis was unreachable, so `forget` never reached it).

for i = 3, #ARGV do
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', 'e', ARGV[i])
end
local now = redis.call('TIME')
local min_id = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) - tonumber(ARGV[2])
if min_id > 0 then
  redis.call('XTRIM', KEYS[1], 'MINID', '~', string.format('%d', min_id))
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return #ARGV - 2
