-- discard: remove every occurrence of a set's members from lists in one pass over each list
-- (no scan per id), keeping the order of the entries that stay. Used by reconciliation to drop
-- ids whose job is terminal or absent.
-- KEYS[1]   set of the ids to remove
-- KEYS[2..] lists to clean
-- ARGV[1]   a marker no job id can equal (job ids are UUIDs)
-- returns   the number of entries removed, over all lists
local chunk = 1000
local removed = 0
for i = 2, #KEYS do
  local start = 0
  local marked = 0
  while true do
    local ids = redis.call('LRANGE', KEYS[i], start, start + chunk - 1)
    if #ids == 0 then break end
    local hits = redis.call('SMISMEMBER', KEYS[1], unpack(ids))
    for j = 1, #ids do
      if hits[j] == 1 then
        redis.call('LSET', KEYS[i], start + j - 1, ARGV[1])
        marked = marked + 1
      end
    end
    start = start + chunk
  end
  if marked > 0 then
    removed = removed + redis.call('LREM', KEYS[i], 0, ARGV[1])
  end
end
return removed
