-- snapshot: copy every id held in the given lists and ZSETs into one set, atomically, so the
-- reconciler can test membership without scanning a list per id.
-- KEYS[1]   destination set (replaced)
-- KEYS[2..] lists or ZSETs to copy
-- ARGV[1]   seconds the destination set lives (a crashed pass leaves no garbage)
-- returns   the number of distinct ids in the destination set
local chunk = 5000
redis.call('DEL', KEYS[1])
for i = 2, #KEYS do
  local kind = redis.call('TYPE', KEYS[i])['ok']
  local start = 0
  while true do
    local ids
    if kind == 'list' then
      ids = redis.call('LRANGE', KEYS[i], start, start + chunk - 1)
    elseif kind == 'zset' then
      ids = redis.call('ZRANGE', KEYS[i], start, start + chunk - 1)
    else
      break
    end
    if #ids == 0 then break end
    redis.call('SADD', KEYS[1], unpack(ids))
    start = start + chunk
  end
end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[1]))
return redis.call('SCARD', KEYS[1])
