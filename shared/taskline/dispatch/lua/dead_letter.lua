-- dead_letter: take an id out of a worker's processing list and into the DLQ list, atomically.
-- KEYS[1]  processing list of the worker
-- KEYS[2]  DLQ list of the queue
-- ARGV[1]  job id
-- returns  1 when the id was in the processing list, else 0
-- From the tail, where the oldest fetched ids are (fetches push at the head).
local removed = redis.call('LREM', KEYS[1], -1, ARGV[1])
redis.call('LPUSH', KEYS[2], ARGV[1])
return removed
