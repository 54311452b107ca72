-- redrive: dead jobs back to available with attempts reset (errors are kept). A dead job whose
-- unique key an unfinished job holds stays dead: reviving it would break uniqueness. Of several
-- dead jobs sharing a key, the first one redriven (the newest, for mode 'all') takes it.
-- Each revived job gets a fresh fair tag, as an enqueue would (fair_tags in the prelude): it
-- joins the current round of its (queue, priority), and a fair key's revived jobs queue up
-- behind that key's waiting ones. Tags go in the order of the ids given (mode 'ids') or by
-- ascending id within the batch (mode 'all').
-- KEYS: the common header, then the blocks of every queue in P:queues.
-- ARGV: n, queue names; now ('' = the store's clock), mode, then
--   mode 'ids': the job ids;
--   mode 'all': queue filter ('' = every queue), cursor (exclusive upper id bound, '+inf' to
--     start), batch: looks at up to batch dead jobs, newest first.
-- Returns {'ok', redriven count, next cursor ('' when done)} or {'stale'} (nothing changed).
if not queues_complete() then return {'stale'} end
local now = clock(arg(1))
local mode = arg(2)
local woken = {}
local back = {}  -- the jobs revived: {id, queue, priority, fair key, concurrency key, rate key}

local function redrive(id)
  local key = P_JOB .. id
  local f = redis.call('HMGET', key, 'state', 'queue', 'unique_key', 'priority', 'fair_key',
    'concurrency_key', 'rate_key')
  if f[1] ~= 'dead' then return end
  local q = Q[f[2]]
  if f[3] then
    local holder = redis.call('HGET', K_UNIQUE, f[3])
    local other = holder and holder ~= id
    if other and is_unfinished(redis.call('HGET', P_JOB .. holder, 'state')) then return end
    redis.call('HSET', K_UNIQUE, f[3], id)
  end
  leave(q, id, 'dead')
  -- Its state now, not in revive(): a repeated id, or an older job with the same unique key,
  -- must see it taken.
  redis.call('HSET', key, 'state', 'available', 'attempt', 0, 'run_at', num(now))
  redis.call('HDEL', key, 'finished_at', 'worker_id')
  redis.call('HINCRBY', key, 'redriven', 1)
  back[#back + 1] = {id, q, f[4], f[5], f[6], f[7]}
end

-- The revived jobs take their fresh tags and enter available.
local function revive()
  local tags = fair_tags()
  for _, b in ipairs(back) do
    local id, q, prio = b[1], b[2], b[3]
    local key = P_JOB .. id
    local tag = tags.take(q, prio, b[4])
    redis.call('HSET', key, 'fair_tag', string.format('%.0f', tag))
    enter_available(q, id, key, now, tonumber(prio), tag, b[5], b[6])
    woken[q.name] = (woken[q.name] or 0) + 1
  end
  tags.save()
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
  -- Walked newest first (for the unique keys), tagged oldest first: a fair key's revived jobs
  -- keep their order within the batch.
  table.sort(back, function(x, y) return tonumber(x[1]) < tonumber(y[1]) end)
end
revive()
for qn, n in pairs(woken) do wake(Q[qn], n) end
return {'ok', #back, cursor}
