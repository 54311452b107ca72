-- history_record: add one flush's counts to the history (backends/history.py), all at once.
-- KEYS (named in K): see HISTORY_KEYS in keys.py. ARGV: groups of seven, one per point: the
-- minute (unix seconds), the queue, processed, failed, dead (integers), wait_sum, run_sum.
-- Zero counts are not written (a hash field less per quiet count).
local INTS = {'processed', 'failed', 'dead'}
local FLOATS = {'wait_sum', 'run_sum'}
for i = 1, #ARGV, 7 do
  local minute, queue = ARGV[i], ARGV[i + 1]
  local key = K.minute .. minute
  for j, name in ipairs(INTS) do
    local v = ARGV[i + 1 + j]
    if v ~= '0' then redis.call('HINCRBY', key, name .. ':' .. queue, v) end
  end
  for j, name in ipairs(FLOATS) do
    local v = ARGV[i + 4 + j]
    if tonumber(v) ~= 0 then redis.call('HINCRBYFLOAT', key, name .. ':' .. queue, v) end
  end
  redis.call('ZADD', K.minutes, minute, minute)
end
return 1
