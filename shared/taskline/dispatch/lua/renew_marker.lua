-- renew_marker: move the rebuild marker forward only if it still holds what its writer last
-- wrote, so a Redis restarted empty or restored from an old snapshot is never stamped fresh
-- (its marker is missing, or an older one).
-- KEYS[1]   the rebuild marker (string "<writer token>:<epoch ms>")
-- ARGV[1]   the value the writer last wrote
-- ARGV[2]   the new value
-- returns   1 when renewed, 0 when the marker held anything else (it is left unchanged)
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return 1
end
return 0
