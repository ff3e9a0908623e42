-- promote: move due ids out of the retry and scheduled sets into a ready list, and wake workers.
-- KEYS[1]  ready list of one priority
-- KEYS[2]  retry ZSET of the queue
-- KEYS[3]  scheduled ZSET of the queue
-- KEYS[4]  signal list of the queue
-- ARGV[1]  maximum length of the signal list
-- ARGV[2..] ids PostgreSQL has just moved to queued
-- returns  the number of ids pushed
for i = 2, #ARGV do
  redis.call('ZREM', KEYS[2], ARGV[i])
  redis.call('ZREM', KEYS[3], ARGV[i])
  redis.call('LPUSH', KEYS[1], ARGV[i])
end
local wake = math.min(#ARGV - 1, tonumber(ARGV[1]))
for _ = 1, wake do redis.call('LPUSH', KEYS[4], '1') end
redis.call('LTRIM', KEYS[4], 0, tonumber(ARGV[1]) - 1)
return #ARGV - 1
