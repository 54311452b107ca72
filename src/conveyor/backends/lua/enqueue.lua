-- enqueue: write a batch of new jobs; all or nothing (the client validated every field first,
-- so nothing below can fail half-way).
-- KEYS: the common header, then one queue block per queue the batch uses.
-- ARGV: n, queue names; now ('' = the store's clock); then 12 values per job:
--   queue, task, args (JSON), priority, delay, run_at ('' = now + delay), max_attempts,
--   timeout_s, has_unique ('1' or '0'), unique_key, meta (JSON), max_depth ('' = no limit)
-- Returns {now, id1, created1, id2, created2, ...}; created is 0 when the unique key is held
-- by an unfinished job, whose id is returned. Returns {'full', queue, depth, limit} and
-- writes nothing when the batch would take a queue past its max_depth.
local now = clock(arg(1))
local t = num(now)
local out = {t}
local made = {}
local W = 12

-- First pass, read only: would the batch overfill a queue? (A script that fails half-way
-- keeps what it wrote, so the check comes before any write.)
local adds, limits, claimed = {}, {}, {}
local j = A + 1
while j <= #ARGV do
  local qn, has_u, uk, limit = ARGV[j], ARGV[j + 8], ARGV[j + 9], ARGV[j + 11]
  j = j + W
  local creates = true
  if has_u == '1' then
    local holder = redis.call('HGET', K_UNIQUE, uk)
    if claimed[uk] or (holder and is_unfinished(redis.call('HGET', P_JOB .. holder, 'state'))) then
      creates = false
    end
    claimed[uk] = true
  end
  if creates then adds[qn] = (adds[qn] or 0) + 1 end
  if limit ~= '' then limits[qn] = tonumber(limit) end
end
for qn, limit in pairs(limits) do
  local q = Q[qn]
  local depth = redis.call('ZCARD', q.available) + redis.call('ZCARD', q.scheduled)
  if depth + (adds[qn] or 0) > limit then
    return {'full', qn, depth, limit}
  end
end

local i = A + 1
while i <= #ARGV do
  local qn, task, args, prio, delay, run_at_s, maxa, timeout, has_u, uk, meta = unpack(ARGV, i, i + 10)
  i = i + W
  local holder = false
  if has_u == '1' then
    holder = redis.call('HGET', K_UNIQUE, uk)
    if holder and not is_unfinished(redis.call('HGET', P_JOB .. holder, 'state')) then holder = false end
  end
  if holder then
    out[#out + 1] = holder
    out[#out + 1] = 0
  else
    local id = tostring(redis.call('INCR', K_IDS))
    local key = P_JOB .. id
    local q = Q[qn]
    local run_at
    if run_at_s ~= '' then run_at = tonumber(run_at_s) else run_at = now + math.max(tonumber(delay), 0) end
    redis.call('HSET', key, 'task', task, 'queue', qn, 'args', args, 'priority', prio,
      'run_at', num(run_at), 'attempt', 0, 'max_attempts', maxa, 'timeout_s', timeout,
      'meta', meta, 'created_at', t)
    if has_u == '1' then
      redis.call('HSET', key, 'unique_key', uk)
      redis.call('HSET', K_UNIQUE, uk, id)
    end
    redis.call('ZADD', K_ALL, id, id)
    redis.call('ZADD', q.jobs, id, id)
    redis.call('SADD', K_QUEUES, qn)
    if run_at > now then
      enter(q, id, key, 'scheduled', run_at)
      wake_if_first_scheduled(q, id)
    else
      enter_available(q, id, key, run_at, tonumber(prio))
      made[qn] = (made[qn] or 0) + 1
    end
    out[#out + 1] = id
    out[#out + 1] = 1
  end
end
for qn, n in pairs(made) do wake(Q[qn], n) end
return out
