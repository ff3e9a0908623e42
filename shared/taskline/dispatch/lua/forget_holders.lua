-- forget_holders: drop from a queue's holder set the workers whose processing list is gone
-- (Redis deletes an emptied list), checked and dropped atomically, so a fetch that makes a
-- worker's list again always leaves the worker registered.
-- KEYS[1]   holder set of the queue
-- KEYS[2..] processing lists of the workers ARGV[1..], in the same order
-- ARGV[i]   id of the worker whose processing list is KEYS[i + 1]
-- returns   the number of workers forgotten
local forgotten = 0
for i = 1, #ARGV do
  if redis.call('EXISTS', KEYS[i + 1]) == 0 then
    forgotten = forgotten + redis.call('SREM', KEYS[1], ARGV[i])
  end
end
return forgotten
