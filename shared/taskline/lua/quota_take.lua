-- quota_take: take `cost` jobs from one client's sliding-window quota, or refuse them all.
--
-- The key is a list of the instants (microseconds, Redis's own clock) of the client's
-- accepted jobs, newest first, trimmed to `limit` entries. `cost` more jobs fit when the entry
-- at index limit - cost (the newest one that must have left the window for them to fit) is
-- absent or older than the window, so no window of `window_us` ever holds more than `limit`
-- accepted jobs, whichever API process or host accepted them.
--
-- KEYS[1]  the client's quota list (taskline.quota.quota_key)
-- ARGV[1]  limit: jobs allowed in any window (1..100000)
-- ARGV[2]  window_us: the window, microseconds
-- ARGV[3]  cost: jobs this request asks for (>= 1)
-- Returns  {taken (1 or 0), retry_after_us (0 when taken, -1 when cost > limit), now_us}

local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
-- Written as digits: Lua would print the number as %.14g and lose its last microseconds.
local stamp = clock[1] .. string.format('%06d', tonumber(clock[2]))

if cost > limit then
  return {0, -1, now}
end
local edge = redis.call('LINDEX', KEYS[1], limit - cost)
if edge and tonumber(edge) > now - window then
  return {0, tonumber(edge) + window - now, now}
end
-- LPUSH in chunks: Lua's unpack is bounded by the C stack (about 8000 values).
local stamps = {}
for i = 1, math.min(cost, 1000) do stamps[i] = stamp end
local left = cost
while left > 0 do
  local n = math.min(left, 1000)
  redis.call('LPUSH', KEYS[1], unpack(stamps, 1, n))
  left = left - n
end
redis.call('LTRIM', KEYS[1], 0, limit - 1)
redis.call('PEXPIRE', KEYS[1], math.ceil(window / 1000) + 1000)
return {1, 0, now}
