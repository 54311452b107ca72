-- redrive: dead jobs back to available with attempts reset (errors are kept, and so is the
-- fair tag, as on the SQL stores). A dead job whose unique key an unfinished job holds stays
-- dead: reviving it would break uniqueness. Of several dead jobs sharing a key, the first one
-- redriven (the newest, for mode 'all') takes it.
-- KEYS: the common header, then the blocks of every queue in P:queues.
-- ARGV: n, queue names; now ('' = the store's clock), mode, then
--   mode 'ids': the job ids;
--   mode 'all': queue filter ('' = every queue), cursor (exclusive upper id bound, '+inf' to
--     start), batch: looks at up to batch dead jobs, newest first.
-- Returns {'ok', redriven count, next cursor ('' when done)} or {'stale'} (nothing changed).
if not queues_complete() then return {'stale'} end
local now = clock(arg(1))
local mode = arg(2)
local count = 0
local woken = {}

local function redrive(id)
  local key = P_JOB .. id
  local f = redis.call('HMGET', key, 'state', 'queue', 'unique_key', 'priority', 'fair_tag', 'concurrency_key',
    'rate_key')
  if f[1] ~= 'dead' then return end
  local q = Q[f[2]]
  if f[3] then
    local holder = redis.call('HGET', K_UNIQUE, f[3])
    if holder and holder ~= id and is_unfinished(redis.call('HGET', P_JOB .. holder, 'state')) then return end
    redis.call('HSET', K_UNIQUE, f[3], id)
  end
  leave(q, id, 'dead')
  redis.call('HSET', key, 'attempt', 0, 'run_at', num(now))
  redis.call('HDEL', key, 'finished_at', 'worker_id')
  redis.call('HINCRBY', key, 'redriven', 1)
  enter_available(q, id, key, now, tonumber(f[4]), tonumber(f[5] or 0), f[6], f[7])
  woken[q.name] = (woken[q.name] or 0) + 1
  count = count + 1
end

local cursor = ''
if mode == 'ids' then
  for i = A + 2, #ARGV do redrive(ARGV[i]) end
else
  local only = arg(3)
  local batch = tonumber(arg(5))
  local upper = arg(4)
  if upper ~= '+inf' then upper = '(' .. upper end
  local ids = redis.call('ZREVRANGEBYSCORE', K_STATE.dead, upper, '-inf', 'LIMIT', 0, batch)
  for _, id in ipairs(ids) do
    if only == '' or redis.call('HGET', P_JOB .. id, 'queue') == only then redrive(id) end
  end
  if #ids == batch then cursor = ids[#ids] end
end
for qn, n in pairs(woken) do wake(Q[qn], n) end
return {'ok', count, cursor}
