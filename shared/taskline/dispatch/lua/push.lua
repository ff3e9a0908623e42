-- push: append ids to a ready list (the tail that is taken last) and wake idle workers.
-- KEYS[1]  ready list of one priority
-- KEYS[2]  signal list of the queue
-- ARGV[1]  maximum length of the signal list
-- ARGV[2..] ids to push, in the order they should run
-- returns  the new length of the ready list
local n = redis.call('LPUSH', KEYS[1], unpack(ARGV, 2))
local wake = math.min(#ARGV - 1, tonumber(ARGV[1]))
for _ = 1, wake do redis.call('LPUSH', KEYS[2], '1') end
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[1]) - 1)
return n
