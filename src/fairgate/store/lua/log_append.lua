-- log_append: one pool's admission events of a flush (store/admission_log.py), in one call:
-- each its own stream entry, then one exact trim to the newest `per_pool`.
--
-- KEYS[1] the pool's stream  ARGV[1] per_pool  ARGV[2 ..] the events (JSON), in order
-- Returns how many were added.

for i = 2, #ARGV do
  redis.call('XADD', KEYS[1], '*', 'e', ARGV[i])
end
redis.call('XTRIM', KEYS[1], 'MAXLEN', ARGV[1])
return #ARGV - 1
