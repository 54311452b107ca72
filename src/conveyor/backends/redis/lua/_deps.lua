-- _deps.lua: dependencies and batches (backends/base.py, "Dependencies"), after _common.lua in
-- the scripts that finish jobs, write them or delete them (DEPS_SCRIPTS in scripts.py); the
-- others (claim, heartbeat, release, ...) do without it.
--   P:kids:<id>       ZSET of the job's children; score 0 while the edge waits for this job to
--                     finish, 1 once settled (or written after it had finished). The job's hash
--                     field 'kids' is '1' while any edge is unsettled: the one field a finish
--                     reads (with the ones it reads anyway) to know there is work here.
--   a child's hash    'parents' (ids joined by ','), 'pending' (unfinished parents, while
--                     waiting), 'on_parent_failure', and 'batch_id', 'callback_of' if set
--   P:batch:<b>       HASH created_at, parent_id, on_success, on_complete (callback ids)
--   P:members:<b>     SET of the ids of its members, nested batches' members and callbacks
--                     included (written to every enclosing batch at enqueue)
local P_KIDS, P_BATCH, P_MEMBERS = K.kids, K.batch, K.members

local function parent_failed(parent, how)
  return '"kind":"parent_failed","type":"ParentFailed","message":'
    .. cjson.encode('job ' .. parent .. ' it was enqueued after is ' .. how)
    .. ',"traceback":""'
end

-- A waiting job leaves the waiting state: cancelled because parent `pid` ended `how` (dead or
-- cancelled), or released (available, or scheduled until its run_at).
local function cancel_waiting(q, id, pid, how, now)
  local key = P_JOB .. id
  leave(q, id, 'waiting')
  add_error(id, redis.call('HGET', key, 'attempt') or '0', now, false, parent_failed(pid, how))
  redis.call('HDEL', key, 'pending')
  redis.call('HSET', key, 'finished_at', num(now))
  enter(q, id, key, 'cancelled', now)
  free_unique(key, id)
end

local function release_waiting(q, id, now)
  local key = P_JOB .. id
  leave(q, id, 'waiting')
  redis.call('HDEL', key, 'pending')
  local f = redis.call('HMGET', key, 'run_at', 'priority', 'fair_tag', 'concurrency_key',
    'rate_key')
  local run_at = tonumber(f[1])
  if run_at > now then
    enter(q, id, key, 'scheduled', run_at)
    wake_if_first_scheduled(q, id)
  else
    enter_available(q, id, key, run_at, tonumber(f[2]), tonumber(f[3] or 0), f[4], f[5])
    wake(q, 1)
  end
end

-- Job `id` is ending `final` (succeeded, dead or cancelled) and its hash says 'kids': what
-- settling its unsettled edges does, and those of each child cancelled so, in turn (a cascade,
-- walked breadth first with a list, never recursion, so a long chain costs no stack). Reads
-- only: returns the plan for apply_children, or nil and the names of the children's queues
-- whose blocks were not given (the caller answers 'need' having written nothing).
local function plan_children(id, final)
  local kids_of, acts, c_of = {}, {}, {}
  local missing, need = {}, {}
  local todo, k = {{id, final}}, 1
  while k <= #todo do
    local pid, how = todo[k][1], todo[k][2]
    k = k + 1
    local kids = redis.call('ZRANGEBYSCORE', P_KIDS .. pid, 0, 0)
    kids_of[#kids_of + 1] = {pid, kids}
    for _, cid in ipairs(kids) do
      local c = c_of[cid]
      if c == nil then
        local f = redis.call('HMGET', P_JOB .. cid, 'state', 'pending', 'on_parent_failure',
          'queue')
        c = {state = f[1], pending = tonumber(f[2] or 0), mode = f[3], queue = f[4]}
        c_of[cid] = c
      end
      if c.state == 'waiting' then
        if not Q[c.queue] and not missing[c.queue] then
          missing[c.queue] = true
          need[#need + 1] = c.queue
        end
        if how ~= 'succeeded' and c.mode ~= 'run' then
          c.state = 'cancelled'
          acts[#acts + 1] = {cid, pid, how}
          todo[#todo + 1] = {cid, 'cancelled'}
        else
          c.pending = c.pending - 1
          c.dirty = true
          if c.pending <= 0 then
            c.state = 'released'
            acts[#acts + 1] = {cid}
          end
        end
      end
    end
  end
  if #need > 0 then return nil, need end
  return {kids_of = kids_of, acts = acts, c_of = c_of}
end

-- Writes a plan of plan_children, once the parent's own transition is written.
local function apply_children(plan, now)
  local kids_of, acts, c_of = plan.kids_of, plan.acts, plan.c_of
  for _, e in ipairs(kids_of) do
    local args = {}
    for _, cid in ipairs(e[2]) do
      args[#args + 1] = 1
      args[#args + 1] = cid
    end
    if #args > 0 then call_many('ZADD', P_KIDS .. e[1], args) end
    redis.call('HDEL', P_JOB .. e[1], 'kids')
  end
  for _, a in ipairs(acts) do
    local c = c_of[a[1]]
    if a[2] then
      cancel_waiting(Q[c.queue], a[1], a[2], a[3], now)
    else
      release_waiting(Q[c.queue], a[1], now)
    end
  end
  for cid, c in pairs(c_of) do
    if c.dirty and c.state == 'waiting' then
      redis.call('HSET', P_JOB .. cid, 'pending', string.format('%d', c.pending))
    end
  end
end

-- For a script finishing one job: the plan if the job has unsettled children (kids: its
-- 'kids' field as the script read it), else nil; or nil and the missing queues.
local function children_plan(id, kids, final)
  if not kids then return nil end
  return plan_children(id, final)
end

-- Whether job `id` has a child not yet finished (prune keeps such a job: the child may read
-- its result).
local function has_unfinished_kid(id)
  local kids = redis.call('ZRANGE', P_KIDS .. id, 0, -1)
  for _, cid in ipairs(kids) do
    if is_unfinished(redis.call('HGET', P_JOB .. cid, 'state')) then return true end
  end
  return false
end

-- The batch `b` and the batches that enclose it, innermost first.
local function batch_chain(b)
  local chain, seen = {}, {}
  while b and not seen[b] do
    seen[b] = true
    chain[#chain + 1] = b
    b = redis.call('HGET', P_BATCH .. b, 'parent_id')
  end
  return chain
end

-- Before job `id` is deleted: what names it in the workflow keys goes with it. Its own
-- children set, its edge in each parent's, its place in its batches' member sets; a batch
-- whose last member this was goes too.
local function forget_links(id)
  local f = redis.call('HMGET', P_JOB .. id, 'parents', 'batch_id')
  redis.call('DEL', P_KIDS .. id)
  if f[1] then
    for pid in string.gmatch(f[1], '[^,]+') do redis.call('ZREM', P_KIDS .. pid, id) end
  end
  if f[2] then
    for _, b in ipairs(batch_chain(f[2])) do
      redis.call('SREM', P_MEMBERS .. b, id)
      if redis.call('EXISTS', P_MEMBERS .. b) == 0 then redis.call('DEL', P_BATCH .. b) end
    end
  end
end
