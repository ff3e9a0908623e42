-- ack: drop ids from one of a worker's processing lists, one copy each.
-- KEYS[1]  processing list of the worker (one queue's, one partition's)
-- ARGV     job ids
-- returns  the number of entries removed
-- From the tail, where the oldest fetched ids are (fetches push at the head): the jobs that
-- finish first sit there, so each search stops after a few entries.
local removed = 0
for i = 1, #ARGV do
  removed = removed + redis.call('LREM', KEYS[1], -1, ARGV[i])
end
return removed
