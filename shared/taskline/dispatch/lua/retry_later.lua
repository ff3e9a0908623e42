-- retry_later: take an id out of a worker's processing list and into the retry set, atomically.
-- KEYS[1]  processing list of the worker
-- KEYS[2]  retry ZSET of the queue
-- ARGV[1]  job id
-- ARGV[2]  due time, milliseconds since the epoch (PostgreSQL's clock)
-- returns  1 when the id was in the processing list, else 0
-- From the tail, where the oldest fetched ids are (fetches push at the head).
local removed = redis.call('LREM', KEYS[1], -1, ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
return removed
