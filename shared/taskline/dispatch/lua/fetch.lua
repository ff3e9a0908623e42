-- fetch: atomically move up to ARGV[1] ids from the most urgent non-empty ready lists into a
-- worker's processing list (oldest first), and wake another idle worker if work remains.
-- Takes nothing from a paused queue (PostgreSQL's claim refuses its jobs anyway; this keeps
-- their ids in the ready lists, in order, instead of moving them back and forth).
-- KEYS[1]     processing list of the fetching worker
-- KEYS[2]     signal list of the queue (idle workers block on it)
-- KEYS[3]     the queue's pause marker
-- KEYS[4]     set of the workers holding a processing list of the queue
-- KEYS[5..14] ready lists, most urgent first (priority 9 .. 0)
-- ARGV[1]     maximum number of ids to move
-- ARGV[2]     maximum length of the signal list
-- ARGV[3]     the fetching worker's id (its processing list is KEYS[1])
-- returns     the moved ids, in the order they were taken
local want = tonumber(ARGV[1])
local moved = {}
if redis.call('EXISTS', KEYS[3]) == 1 then return moved end
for i = 5, #KEYS do
  while #moved < want do
    local id = redis.call('LMOVE', KEYS[i], KEYS[1], 'RIGHT', 'LEFT')
    if not id then break end
    moved[#moved + 1] = id
  end
  if #moved >= want then
    for j = i, #KEYS do
      if redis.call('LLEN', KEYS[j]) > 0 then
        redis.call('LPUSH', KEYS[2], '1')
        redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[2]) - 1)
        break
      end
    end
    break
  end
end
-- Registered with the list it creates, so reconciliation finds every list without SCAN.
if #moved > 0 then redis.call('SADD', KEYS[4], ARGV[3]) end
return moved
