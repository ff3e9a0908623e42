-- requeue: move an id from a processing list back to a ready list (recovered, released or
-- stranded), at the end that is taken next, and wake a worker.
-- KEYS[1]  processing list holding the id
-- KEYS[2]  ready list of the job's priority
-- KEYS[3]  signal list of the queue
-- ARGV[1]  job id
-- ARGV[2]  "always": push even when the id was not in the processing list (PostgreSQL says
--          the job is queued, so it must be dispatchable); "if_present": move only if found
-- ARGV[3]  maximum length of the signal list
-- returns  1 when the id was pushed, else 0
local removed = redis.call('LREM', KEYS[1], 1, ARGV[1])
if removed == 0 and ARGV[2] ~= 'always' then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('LPUSH', KEYS[3], '1')
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[3]) - 1)
return 1
