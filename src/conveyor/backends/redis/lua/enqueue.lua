-- enqueue: write a batch of new jobs; all or nothing (the client validated every field first,
-- so nothing below can fail half-way). Also the cron tick: with a schedule name, the batch is
-- written only if it takes that schedule's tick (a compare-and-set of P:cron in the same script).
-- KEYS: the common header, then one queue block per queue the batch uses.
-- ARGV: n, queue names; now ('' = the store's clock), cron schedule ('' = none), cron tick
--   (unix seconds, when a schedule is given); then 21 values per job:
--   uid (made by the client: random, see Job.uid), queue, task, args (JSON), priority, delay,
--   run_at ('' = now + delay), max_attempts,
--   timeout_s, has_unique ('1' or '0'), unique_key, meta (JSON), max_depth ('' = no limit),
--   unique_for ('' = none), has_fair ('1' or '0'), fair_key, concurrency_key,
--   concurrency_limit ('' = no concurrency limit: the key is then ignored), rate_key,
--   rate_limit ('' = no rate limit: the key and period are then ignored), rate_period
-- Returns {now, id1, created1, id2, created2, ...}; created is 0 when the unique key is held
-- (by an unfinished job, or by one that succeeded less than its unique_for ago), whose id is
-- returned. Returns {'full', queue, depth, limit} and writes nothing (not the tick either) when
-- the batch would take a queue past its max_depth; {'taken'} and writes nothing when the
-- schedule's recorded tick is not older than the given one.
local now = clock(arg(1))
local cron, tick = arg(2), tonumber(arg(3))
local t = num(now)
local out = {t}
local made = {}
local W = 21
local FIRST = A + 3

if cron ~= '' then
  local last = redis.call('HGET', K_CRON, cron)
  if last and tonumber(last) >= tick then return {'taken'} end
end

-- Does the job `holder` (an id from P:unique, or false) still hold its unique key at now?
local function holds(holder)
  if not holder then return false end
  local f = redis.call('HMGET', P_JOB .. holder, 'state', 'unique_for', 'finished_at')
  if is_unfinished(f[1]) then return true end
  return f[1] == 'succeeded' and f[2] ~= false and f[3] ~= false
    and tonumber(f[3]) + tonumber(f[2]) > now
end

-- First pass, read only: would the batch overfill a queue? (A script that fails half-way
-- keeps what it wrote, so the check comes before any write.) It decides "created" exactly as
-- the write pass below does.
local adds, limits, claimed = {}, {}, {}
local j = FIRST
while j <= #ARGV do
  local qn, has_u, uk, limit = ARGV[j + 1], ARGV[j + 9], ARGV[j + 10], ARGV[j + 12]
  j = j + W
  local creates = true
  if has_u == '1' then
    if claimed[uk] or holds(redis.call('HGET', K_UNIQUE, uk)) then creates = false end
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

if cron ~= '' then redis.call('HSET', K_CRON, cron, num(tick)) end

-- Fair tags (start-time fair queuing per (queue, priority), see fair_tags in the prelude).
local tags = fair_tags()

-- The write pass. Each job's hash is written as it is made (a later job of the batch may read
-- it: a repeated unique key); the index entries of the whole batch are gathered and written
-- after the loop, a few calls per queue instead of several per job.
local all_ids, queues_used, per_q = {}, {}, {}
local function batch_of(qn)
  local b = per_q[qn]
  if b == nil then
    b = {jobs = {}, scheduled = {}, scheduled_ids = {}, global_scheduled = {}, available = {},
      due = {}, gated = 0}
    per_q[qn] = b
    queues_used[#queues_used + 1] = qn
  end
  return b
end
local state_ids = {scheduled = {}, available = {}}

local i = FIRST
while i <= #ARGV do
  local uid = ARGV[i]
  local qn, task, args, prio, delay, run_at_s, maxa, timeout, has_u, uk, meta =
    unpack(ARGV, i + 1, i + 11)
  local ufor, has_fair, fk = ARGV[i + 13], ARGV[i + 14], ARGV[i + 15]
  local ck, climit, rk, rlimit, rperiod = unpack(ARGV, i + 16, i + 20)
  i = i + W
  local holder = false
  if has_u == '1' then
    holder = redis.call('HGET', K_UNIQUE, uk)
    if not holds(holder) then holder = false end
  end
  if holder then
    out[#out + 1] = holder
    out[#out + 1] = 0
  else
    local id = tostring(redis.call('INCR', K_IDS))
    local key = P_JOB .. id
    local q = Q[qn]
    local b = batch_of(qn)
    local run_at
    if run_at_s ~= '' then
      run_at = tonumber(run_at_s)
    else
      run_at = now + math.max(tonumber(delay), 0)
    end
    local tag = tags.take(q, prio, has_fair == '1' and fk)
    local fields = {'task', task, 'queue', qn, 'args', args, 'priority', prio,
      'run_at', num(run_at), 'attempt', 0, 'max_attempts', maxa, 'timeout_s', timeout,
      'meta', meta, 'created_at', t, 'uid', uid, 'fair_tag', string.format('%.0f', tag)}
    local function field(name, value)
      fields[#fields + 1] = name
      fields[#fields + 1] = value
    end
    if has_u == '1' then
      field('unique_key', uk)
      if ufor ~= '' then field('unique_for', ufor) end
    end
    if has_fair == '1' then field('fair_key', fk) end
    if climit ~= '' then
      field('concurrency_key', ck)
      field('concurrency_limit', climit)
    end
    if rlimit ~= '' then
      field('rate_key', rk)
      field('rate_limit', rlimit)
      field('rate_period', rperiod)
    end
    -- As enter() and enter_available() would write them, with the rest of the hash.
    if run_at > now then
      field('state', 'scheduled')
      local sch = b.scheduled
      sch[#sch + 1] = num(run_at)
      sch[#sch + 1] = id
      local gs = b.global_scheduled
      gs[#gs + 1] = num(run_at)
      gs[#gs + 1] = gmember(q, id)
      b.scheduled_ids[id] = true
      local ids = state_ids.scheduled
      ids[#ids + 1] = id
      ids[#ids + 1] = id
    else
      local m = member(tag, run_at, id)
      field('state', 'available')
      field('m', m)
      local av, due = b.available, b.due
      av[#av + 1] = prio
      av[#av + 1] = m
      due[#due + 1] = num(run_at)
      due[#due + 1] = id
      local ids = state_ids.available
      ids[#ids + 1] = id
      ids[#ids + 1] = id
      if climit ~= '' or rlimit ~= '' then b.gated = b.gated + 1 end
      made[qn] = (made[qn] or 0) + 1
    end
    redis.call('HSET', key, unpack(fields))
    if has_u == '1' then redis.call('HSET', K_UNIQUE, uk, id) end
    all_ids[#all_ids + 1] = id
    all_ids[#all_ids + 1] = id
    local jobs = b.jobs
    jobs[#jobs + 1] = id
    jobs[#jobs + 1] = id
    out[#out + 1] = id
    out[#out + 1] = 1
  end
end
tags.save()
if #all_ids > 0 then
  call_many('ZADD', K_ALL, all_ids)
  call_many('SADD', K_QUEUES, queues_used)
end
for state, ids in pairs(state_ids) do
  if #ids > 0 then call_many('ZADD', K_STATE[state], ids) end
end
for _, qn in ipairs(queues_used) do
  local q, b = Q[qn], per_q[qn]
  call_many('ZADD', q.jobs, b.jobs)
  if #b.available > 0 then
    call_many('ZADD', q.available, b.available)
    call_many('ZADD', q.due, b.due)
    redis.call('HDEL', q.fair, 'hold')  -- (unhold)
  end
  if b.gated > 0 then redis.call('HINCRBY', q.fair, 'gated', b.gated) end
  if #b.scheduled > 0 then
    call_many('ZADD', q.scheduled, b.scheduled)
    call_many('ZADD', K_SCHEDULE, b.global_scheduled)
    -- A new job that is now the queue's earliest scheduled one moves idle workers' next due time.
    local head = redis.call('ZRANGE', q.scheduled, 0, 0)
    if b.scheduled_ids[head[1]] then wake(q, 1) end
  end
end
for qn, n in pairs(made) do wake(Q[qn], n) end
return out
