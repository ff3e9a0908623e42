-- drop_dead: remove the ids of deleted dead jobs from their queue's DLQ list, keeping the order
-- of the rest. The list is read from its tail in chunks, since dead_letter pushes at the head:
-- the oldest dead jobs, which retention deletes first, sit at the tail. The read stops once
-- every id was found, so a call costs about the entries it removes, not the list's length (an
-- id the list no longer holds costs one read of the whole list).
-- KEYS[1]   DLQ list of the queue
-- ARGV[1]   a marker no job id can equal (job ids are UUIDs)
-- ARGV[2..] ids to remove
-- returns   the number of entries removed
local chunk = 1000
local wanted, left = {}, 0
for i = 2, #ARGV do
  if not wanted[ARGV[i]] then
    wanted[ARGV[i]] = 1
    left = left + 1
  end
end
local marked = 0
local pos = redis.call('LLEN', KEYS[1])
while left > 0 and pos > 0 do
  local first = math.max(pos - chunk, 0)
  local ids = redis.call('LRANGE', KEYS[1], first, pos - 1)
  for j = #ids, 1, -1 do
    local state = wanted[ids[j]]
    if state then
      -- A copy found twice is marked twice; only its first sighting counts towards the stop.
      redis.call('LSET', KEYS[1], first + j - 1, ARGV[1])
      marked = marked + 1
      if state == 1 then
        wanted[ids[j]] = 2
        left = left - 1
      end
    end
  end
  pos = first
end
if marked == 0 then
  return 0
end
-- From the tail, where the marks are: stops after the last one instead of reading the list.
return redis.call('LREM', KEYS[1], -marked, ARGV[1])
