-- history_rollup: retention of the history (backends/history.py), bounded. Minute hashes older
-- than the cutoff are added into their hour's hash and deleted, then hour hashes older than
-- the kept days are deleted; one script, so a flush never lands between reading a minute and
-- deleting it.
-- KEYS (named in K): see HISTORY_KEYS in keys.py. ARGV: now ('' for the server's clock), the
-- seconds hourly rows are kept, the most buckets of each kind to handle, the seconds minute
-- rows are kept. Returns the rows (one queue's counts in a bucket) rolled up or deleted; the
-- limit counts buckets, each with all its queues.
local function rows(flat, step)
  local queues, count = {}, 0
  for i = 1, #flat, step do
    local q = string.match(flat[i], '^[^:]*:(.*)$')
    if q and not queues[q] then queues[q] = true; count = count + 1 end
  end
  return count
end
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1e6
end
local keep, limit, minutes_kept = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local cutoff = math.floor((now - minutes_kept) / 3600) * 3600
local n = 0
for _, minute in ipairs(redis.call('ZRANGEBYSCORE', K.minutes, '-inf', '(' .. cutoff,
                                   'LIMIT', 0, limit)) do
  local m = tonumber(minute)
  local hour = tostring(m - m % 3600)
  local hkey = K.hour .. hour
  local flat = redis.call('HGETALL', K.minute .. minute)
  for i = 1, #flat, 2 do
    local field, v = flat[i], flat[i + 1]
    if string.find(field, '^%a+_sum:') then
      redis.call('HINCRBYFLOAT', hkey, field, v)
    else
      redis.call('HINCRBY', hkey, field, v)
    end
  end
  if #flat > 0 then redis.call('ZADD', K.hours, hour, hour) end
  redis.call('DEL', K.minute .. minute)
  redis.call('ZREM', K.minutes, minute)
  n = n + rows(flat, 2)
end
for _, hour in ipairs(redis.call('ZRANGEBYSCORE', K.hours, '-inf', '(' .. (now - keep),
                                 'LIMIT', 0, limit)) do
  n = n + rows(redis.call('HKEYS', K.hour .. hour), 1)
  redis.call('DEL', K.hour .. hour)
  redis.call('ZREM', K.hours, hour)
end
return n
