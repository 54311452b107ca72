-- enqueue: write a batch of new jobs; all or nothing (the client validated every field first,
-- so nothing below can fail half-way). Also the cron tick: with a schedule name, the batch is
-- written only if it takes that schedule's tick (a compare-and-set of P:cron in the same script).
-- KEYS: the common header, then one queue block per queue the batch uses.
-- ARGV: n, queue names; now ('' = the store's clock), cron schedule ('' = none), cron tick
--   (unix seconds, when a schedule is given), number of batches nb, outbox ('1': mark each job
--   created in P:outbox at now, Backend.outbox), uids (every job's uid, 32 hex digits each, one
--   after the other in job order; made by the client: random, see Job.uid), number of runs nr;
--   then nb pairs: batch id, enclosing batch id ('' = none); then nr runs of R values:
--   how many jobs the run has, then the fields its jobs share (a bulk enqueue's jobs differ
--   in little but their args, so these are sent and read once per run, not once per job):
--   queue, task, priority, delay, run_at ('' = now + delay), max_attempts, timeout_s,
--   has_unique ('1' or '0'), unique_key, meta (JSON), max_depth ('' = no limit),
--   unique_for ('' = none), has_fair ('1' or '0'), fair_key, concurrency_key,
--   concurrency_limit ('' = no concurrency limit: the key is then ignored), rate_key,
--   rate_limit ('' = no rate limit: the key and period are then ignored), rate_period,
--   after (parent ids joined by ','), after_refs (earlier positions, 0-based, joined by ','),
--   on_parent_failure ('cancel' or 'run'), batch_id ('' = none), callback_of ('' = none);
--   then every job's args (JSON), one value per job, in job order (the runs' jobs one after
--   the other).
-- Dependencies and batches (see _deps.lua): every parent and batch is checked in the read-only
-- pass, so a refusal writes nothing. A job whose parents are all done is written ready
-- (available or scheduled); one with an unfinished parent waiting, with 'pending' = how many;
-- one with a dead or cancelled parent cancelled at once (unless on_parent_failure is 'run').
-- A reference to a position whose unique key was held names the holder.
-- Returns {now, id1, created1, id2, created2, ...}; created is 0 when the unique key is held
-- (by an unfinished job, or by one that succeeded less than its unique_for ago), whose id is
-- returned. Returns {'full', queue, depth, limit} and writes nothing (not the tick either) when
-- the batch would take a queue past its max_depth; {'taken'} and writes nothing when the
-- schedule's recorded tick is not older than the given one; {'off'} and writes only the tick
-- when the schedule is disabled or the tick is from before it was enabled again; {'unknown', parent id or 'ref',
-- detail} or {'batch', batch id, why} and writes nothing for a parent or batch that is not
-- there (or a reference to the job itself or a later one).
local now = clock(arg(1))
local cron, tick = arg(2), tonumber(arg(3))
local t = num(now)
local out = {t}
local nb = tonumber(arg(4))
local outbox = arg(5) == '1'
local uids = arg(6)
local nr = tonumber(arg(7))
local R = 25
local FIRST_RUN = A + 7 + 2 * nb
local FIRST_ARGS = FIRST_RUN + R * nr

-- Run r's values are ARGV[run_start(r) + k], k = 0 (how many jobs) to R - 1 (callback_of), read
-- where used: a batch of one-job runs (every job with a unique key of its own, a chain) makes
-- no table per run.
local function run_start(r) return FIRST_RUN + R * (r - 1) end

if cron ~= '' then
  local last = redis.call('HGET', K_CRON, cron)
  if last and tonumber(last) >= tick then return {'taken'} end
  -- A disabled schedule, or a tick from before it was enabled again: the tick is taken, and
  -- no job written.
  local on = redis.call('HGET', K.cron_on, cron)
  if redis.call('HEXISTS', K.cron_off, cron) == 1 or (on and tonumber(on) > tick) then
    redis.call('HSET', K_CRON, cron, num(tick))
    return {'off'}
  end
end

-- Does the job `holder` (an id from P:unique, or false) still hold its unique key at now?
local function holds(holder)
  if not holder then return false end
  local f = redis.call('HMGET', P_JOB .. holder, 'state', 'unique_for', 'finished_at')
  if is_unfinished(f[1]) then return true end
  return f[1] == 'succeeded' and f[2] ~= false and f[3] ~= false
    and tonumber(f[3]) + tonumber(f[2]) > now
end

-- The batches written with the jobs: id -> enclosing id ('' = none). An enclosing batch is one
-- written before, or earlier in this list, so the chain of enclosing batches has no cycle.
local new_batches = {}
for b = 0, nb - 1 do
  local bid, outer = arg(8 + 2 * b), arg(9 + 2 * b)
  if new_batches[bid] or redis.call('EXISTS', P_BATCH .. bid) == 1 then
    return {'batch', bid, 'exists already'}
  end
  if outer ~= '' and not new_batches[outer] and redis.call('EXISTS', P_BATCH .. outer) == 0 then
    return {'batch', outer, 'is not in the store'}
  end
  new_batches[bid] = outer
end
local function known_batch(b)
  return new_batches[b] ~= nil or redis.call('EXISTS', P_BATCH .. b) == 1
end
-- The batch b and those enclosing it, innermost first.
local function chain_of(b)
  local out = {}
  while b and b ~= '' do
    out[#out + 1] = b
    if new_batches[b] ~= nil then
      b = new_batches[b]
    else
      b = redis.call('HGET', P_BATCH .. b, 'parent_id')
    end
  end
  return out
end
local function done_as(state)
  if state == 'succeeded' then return 'succeeded' end
  if state == 'dead' or state == 'cancelled' then return state end
  return 'unfinished'
end
-- The batch and callback a run's created jobs name must be there (one check per run).
local function check_batches(bid, cb)
  if bid ~= '' and not known_batch(bid) then return {'batch', bid, 'is not in the store'} end
  if cb ~= '' and not known_batch(cb) then return {'batch', cb, 'is not in the store'} end
end

-- First pass, read only: would the batch overfill a queue, does every parent and batch exist?
-- (A script that fails half-way keeps what it wrote, so the checks come before any write.) It
-- decides which jobs are created, and the write pass follows it. pos[n] (n from 0, the job's
-- position), kept only for a job of a run with a unique key or parents: ident (an existing
-- id, or '#<position>' of a job this call creates), st (its parents' view of it: unfinished,
-- succeeded, dead or cancelled), held (its unique key is held: not created), and for a job
-- it creates with parents: parents ({ident, st}...), outcome (waiting, ready or cancelled),
-- pending, failed_by. Any other job is created ready: '#<position>', unfinished (pos_of).
local adds, limits, claimed = {}, {}, {}
local pos = {}
local function pos_of(at) return pos[at] or {ident = '#' .. at, st = 'unfinished'} end
local creators = 0
local n = 0
for r = 1, nr do
  local i = run_start(r)
  local count, qn, has_u, uk = tonumber(ARGV[i]), ARGV[i + 1], ARGV[i + 8] == '1', ARGV[i + 9]
  local after_s, refs_s, mode = ARGV[i + 20], ARGV[i + 21], ARGV[i + 22]
  local bid, cb = ARGV[i + 23], ARGV[i + 24]
  if not has_u and after_s == '' and refs_s == '' then
    -- Nothing to decide per job: every job of the run is created, ready.
    local bad = check_batches(bid, cb)
    if bad then return bad end
    creators = creators + count
    adds[qn] = (adds[qn] or 0) + count
    n = n + count
  else
    for _ = 1, count do
      local p = {ident = '#' .. n, st = 'unfinished'}
      local creates = true
      if has_u then
        local earlier = claimed[uk]
        local holder = redis.call('HGET', K_UNIQUE, uk)
        if earlier then
          creates = false
          p.ident, p.st = pos[earlier].ident, pos[earlier].st
        elseif holds(holder) then
          creates = false
          p.ident, p.st = holder, done_as(redis.call('HGET', P_JOB .. holder, 'state'))
        end
        if creates then claimed[uk] = n end
      end
      if creates and (after_s ~= '' or refs_s ~= '') then
        local parents, seen = {}, {}
        local pending, failed_by = 0, nil
        local function add(ident, st)
          if seen[ident] then return end
          seen[ident] = true
          parents[#parents + 1] = {ident, st}
          if st == 'unfinished' then
            pending = pending + 1
          elseif st ~= 'succeeded' and not failed_by then
            failed_by = {ident, st}
          end
        end
        for pid in string.gmatch(after_s, '[^,]+') do
          local st = redis.call('HGET', P_JOB .. pid, 'state')
          if not st then return {'unknown', pid, 'no such job'} end
          add(pid, done_as(st))
        end
        for r in string.gmatch(refs_s, '[^,]+') do
          local at = tonumber(r)
          if at < 0 or at >= n then
            return {'unknown', r, 'job ' .. n .. ' of the batch refers to position ' .. r
              .. ' (only earlier jobs of the same call can be named)'}
          end
          local e = pos_of(at)
          add(e.ident, e.st)
        end
        p.parents, p.pending, p.failed_by = parents, pending, failed_by
        if failed_by and mode ~= 'run' then
          p.outcome, p.st = 'cancelled', 'cancelled'
          if has_u then claimed[uk] = nil end  -- a finished job holds no unique key
        elseif pending > 0 then
          p.outcome = 'waiting'
        else
          p.outcome = 'ready'
        end
      end
      if creates then
        local bad = check_batches(bid, cb)
        if bad then return bad end
        creators = creators + 1
      else
        p.held = true
      end
      pos[n] = p
      n = n + 1
      if creates and (p.outcome == nil or p.outcome == 'ready') then
        adds[qn] = (adds[qn] or 0) + 1
      end
    end
  end
  if ARGV[i + 11] ~= '' then limits[qn] = tonumber(ARGV[i + 11]) end
end
for qn, limit in pairs(limits) do
  local q = Q[qn]
  local depth = redis.call('ZCARD', q.available) + redis.call('ZCARD', q.scheduled)
  if depth + (adds[qn] or 0) > limit then
    return {'full', qn, depth, limit}
  end
end

if cron ~= '' then redis.call('HSET', K_CRON, cron, num(tick)) end
for bid, outer in pairs(new_batches) do
  if outer ~= '' then
    redis.call('HSET', P_BATCH .. bid, 'created_at', t, 'parent_id', outer)
  else
    redis.call('HSET', P_BATCH .. bid, 'created_at', t)
  end
end

-- Fair tags (start-time fair queuing per (queue, priority), see fair_tags in the prelude).
local tags = fair_tags()

-- The write pass. Each job's hash is written as it is made; the index entries of the whole
-- batch are gathered and written after the loop, a few calls per queue instead of several per
-- job. What a run's jobs share (the hash's common fields, run_at, the tag of a job without a
-- fair key, the member's head) is worked out once per run.
local all_ids, queues_used, per_q = {}, {}, {}
local function batch_of(qn)
  local b = per_q[qn]
  if b == nil then
    b = {jobs = {}, scheduled = {}, scheduled_ids = {}, global_scheduled = {}, available = {},
      due = {}, gated = 0, waiting = {}, cancelled = {}, made = 0}
    per_q[qn] = b
    queues_used[#queues_used + 1] = qn
  end
  return b
end
local state_ids = {scheduled = {}, available = {}, waiting = {}, cancelled = {}}
local ids_at = {}
local function id_of_ident(ident)
  if string.sub(ident, 1, 1) == '#' then return ids_at[tonumber(string.sub(ident, 2))] end
  return ident
end
local cancelled_now = {}  -- {id, failed parent id, how} of jobs cancelled at once
local marks = {}  -- P:outbox entries (score, id) of the created jobs, while the outbox is on
local next_id = creators > 0 and new_ids(K_IDS, creators)
local made_ids = 0

local j = FIRST_ARGS - 1
n = -1
for r = 1, nr do
  local i = run_start(r)
  local count, qn, prio, has_u, uk = tonumber(ARGV[i]), ARGV[i + 1], ARGV[i + 3],
    ARGV[i + 8] == '1', ARGV[i + 9]
  local climit, rlimit, mode, bid, cb = ARGV[i + 16], ARGV[i + 18], ARGV[i + 22], ARGV[i + 23],
    ARGV[i + 24]
  local q = Q[qn]
  -- batch_of(qn), taken at the run's first created job: a run whose jobs were all held puts
  -- nothing in the queue, nor the queue in P:queues.
  local b
  local run_at
  if ARGV[i + 5] ~= '' then
    run_at = tonumber(ARGV[i + 5])
  else
    run_at = now + math.max(tonumber(ARGV[i + 4]), 0)
  end
  local scheduled = run_at > now
  local rt = num(run_at)
  local fk = ARGV[i + 13] == '1' and ARGV[i + 14]
  local gated = climit ~= '' or rlimit ~= ''
  -- Without a fair key, every job of the run takes the same tag (tags.take), so one member
  -- head serves them all.
  local tag, head
  if not fk then
    tag = tags.take(q, prio, false)
    head = member_head(tag, run_at)
  end
  -- The hash's fields every job of the run has, in the order they were always written; the
  -- per-job ones (args, uid, fair_tag) are filled in, and each job's tail (parents, state,
  -- ...) written after `common`, in the same table.
  local fields = {'task', ARGV[i + 2], 'queue', qn, 'args', '', 'priority', prio,
    'run_at', rt, 'attempt', 0, 'max_attempts', ARGV[i + 6], 'timeout_s', ARGV[i + 7],
    'meta', ARGV[i + 10], 'created_at', t, 'uid', '',
    'fair_tag', tag and string.format('%.0f', tag) or ''}
  local ARGS_AT, UID_AT, TAG_AT = 6, 22, 24
  local function field(name, value)
    fields[#fields + 1] = name
    fields[#fields + 1] = value
  end
  if has_u then
    field('unique_key', uk)
    if ARGV[i + 12] ~= '' then field('unique_for', ARGV[i + 12]) end
  end
  if fk then field('fair_key', fk) end
  if climit ~= '' then
    field('concurrency_key', ARGV[i + 15])
    field('concurrency_limit', climit)
  end
  if rlimit ~= '' then
    field('rate_key', ARGV[i + 17])
    field('rate_limit', rlimit)
    field('rate_period', ARGV[i + 19])
  end
  if bid ~= '' then field('batch_id', bid) end
  if cb ~= '' then field('callback_of', cb) end
  local common = #fields
  local members = bid ~= '' and {}  -- the run's created ids, for its batches' member sets
  for _ = 1, count do
    n = n + 1
    j = j + 1
    local p = pos[n]
    if p and p.held then
      local holder = id_of_ident(p.ident)
      ids_at[n] = holder
      out[#out + 1] = holder
      out[#out + 1] = 0
    else
      b = b or batch_of(qn)
      made_ids = made_ids + 1
      local id, idn = next_id(made_ids)
      ids_at[n] = id
      fields[ARGS_AT] = ARGV[j]
      fields[UID_AT] = string.sub(uids, 32 * n + 1, 32 * n + 32)
      if fk then
        tag = tags.take(q, prio, fk)
        fields[TAG_AT] = string.format('%.0f', tag)
      end
      local len = common
      if members then members[#members + 1] = id end
      if cb ~= '' then
        redis.call('HSET', P_BATCH .. cb, mode == 'run' and 'on_complete' or 'on_success', id)
      end
      local outcome = (p and p.outcome) or 'ready'
      if p and p.parents then
        local ps = {}
        for k, e in ipairs(p.parents) do
          local pid = id_of_ident(e[1])
          ps[k] = tonumber(pid)
          -- The edge: unsettled (0) while the parent is unfinished; a cancelled job has none.
          if outcome ~= 'cancelled' then
            if e[2] == 'unfinished' then
              redis.call('ZADD', P_KIDS .. pid, 0, id)
              redis.call('HSET', P_JOB .. pid, 'kids', '1')
            else
              redis.call('ZADD', P_KIDS .. pid, 1, id)
            end
          end
        end
        table.sort(ps)
        for k, v in ipairs(ps) do ps[k] = string.format('%.0f', v) end
        fields[len + 1], fields[len + 2] = 'parents', table.concat(ps, ',')
        fields[len + 3], fields[len + 4] = 'on_parent_failure', mode
        len = len + 4
      end
      -- As enter() and enter_available() would write them, with the rest of the hash.
      if outcome == 'waiting' then
        fields[len + 1], fields[len + 2] = 'state', 'waiting'
        fields[len + 3], fields[len + 4] = 'pending', string.format('%d', p.pending)
        len = len + 4
        local wt = b.waiting
        wt[#wt + 1] = id
        wt[#wt + 1] = id
        local ids = state_ids.waiting
        ids[#ids + 1] = id
        ids[#ids + 1] = id
      elseif outcome == 'cancelled' then
        fields[len + 1], fields[len + 2] = 'state', 'cancelled'
        fields[len + 3], fields[len + 4] = 'finished_at', t
        len = len + 4
        local cn = b.cancelled
        cn[#cn + 1] = t
        cn[#cn + 1] = id
        local ids = state_ids.cancelled
        ids[#ids + 1] = id
        ids[#ids + 1] = id
        cancelled_now[#cancelled_now + 1] = {id, id_of_ident(p.failed_by[1]), p.failed_by[2]}
      elseif scheduled then
        fields[len + 1], fields[len + 2] = 'state', 'scheduled'
        len = len + 2
        local sch = b.scheduled
        sch[#sch + 1] = rt
        sch[#sch + 1] = id
        local gs = b.global_scheduled
        gs[#gs + 1] = rt
        gs[#gs + 1] = gmember(q, id)
        b.scheduled_ids[id] = true
        local ids = state_ids.scheduled
        ids[#ids + 1] = id
        ids[#ids + 1] = id
      else
        local m = (fk and member_head(tag, run_at) or head) .. string.format('%016.0f', idn)
        fields[len + 1], fields[len + 2] = 'state', 'available'
        fields[len + 3], fields[len + 4] = 'm', m
        len = len + 4
        local av, due = b.available, b.due
        av[#av + 1] = prio
        av[#av + 1] = m
        due[#due + 1] = rt
        due[#due + 1] = id
        local ids = state_ids.available
        ids[#ids + 1] = id
        ids[#ids + 1] = id
        if gated then b.gated = b.gated + 1 end
        b.made = b.made + 1
      end
      redis.call('HSET', P_JOB .. id, unpack(fields, 1, len))
      if has_u and outcome ~= 'cancelled' then redis.call('HSET', K_UNIQUE, uk, id) end
      all_ids[#all_ids + 1] = id
      all_ids[#all_ids + 1] = id
      local jobs = b.jobs
      jobs[#jobs + 1] = id
      jobs[#jobs + 1] = id
      out[#out + 1] = id
      out[#out + 1] = 1
      if outbox then
        marks[#marks + 1] = t
        marks[#marks + 1] = id
      end
    end
  end
  if members and #members > 0 then
    for _, outer in ipairs(chain_of(bid)) do call_many('SADD', P_MEMBERS .. outer, members) end
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
  if #b.jobs > 0 then call_many('ZADD', q.jobs, b.jobs) end
  if #b.waiting > 0 then call_many('ZADD', q.waiting, b.waiting) end
  if #b.cancelled > 0 then call_many('ZADD', q.cancelled, b.cancelled) end
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
  wake(q, b.made)
end
for _, c in ipairs(cancelled_now) do
  add_error(c[1], 0, now, false, parent_failed(c[2], c[3]))
end
if cron ~= '' and ids_at[0] then redis.call('HSET', K.cron_jobs, cron, ids_at[0]) end
if #marks > 0 then call_many('ZADD', K.outbox, marks) end
return out
