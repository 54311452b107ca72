-- _common.lua: the prelude every Conveyor script but enqueue_one starts with, after _core.lua
-- (scripts.py prepends both at load, after the key names keys.py generates: K, K_STATE,
-- STATES, NHEAD, NQK and queue_keys; see lua_layout there).
--
-- KEYS, the same header for every script, in the order of STORE_KEYS in keys.py. Scripts name
-- each key (K.unique, K_STATE.running, q.available), never its position. P is the app's prefix
-- "{name}", whose braces are the Redis Cluster hash tag, so every key below, and every key made
-- by appending a job id to a prefix key, lands in one slot:
--   job        P:job:        prefix key; P:job:<id> is the job's HASH (step records are its
--                            fields step:<name>)
--   errors     P:errors:     prefix key; P:errors:<id> is the job's LIST of error JSON objects
--   jobs       P:jobs        ZSET of every job id (score = id), for listing newest first
--   state:<s>  P:state:<s>   one ZSET of ids per state in STATES (score = id), for listing by
--                            state
--   unique     P:unique      HASH unique_key -> id of the job holding it (unfinished, or
--                            succeeded with a unique_for: enqueue checks finished_at +
--                            unique_for > now)
--   expiries   P:expiries    HASH queue -> number of leases that expired; 'missing/<queue>' ->
--                            ids found without a job hash and dropped (see forget_missing)
--   queues     P:queues      SET of the queues that hold jobs (see forget_queue_if_empty)
--   ids        P:ids         STRING, INCR counter of job ids
--   workers    P:workers     HASH worker id -> JSON info
--   seen       P:seen        ZSET worker id -> last_seen
--   cron       P:cron        HASH cron schedule name -> last tick taken (unix seconds)
--   cron_jobs  P:cron:jobs   HASH cron schedule name -> id of its latest tick's job
--   cron_off   P:cron:off    HASH disabled cron schedule name -> when it was disabled
--   cron_on    P:cron:on     HASH cron schedule name -> when it was last enabled again
--   conc       P:conc:       prefix key; P:conc:<concurrency key> is a ZSET of the ids of the
--                            running jobs with that key, score = lease_expires_at (claim adds,
--                            leave() removes, heartbeat rescores; emptied keys vanish)
--   rate       P:rate:       prefix key; P:rate:<rate key> is a ZSET of the claims of jobs with
--                            that key, member = id:lease token, score = claim time + the job's
--                            rate_period (the end of its window); PEXPIREd to its last entry
--   leases     P:leases      ZSET of every running job across queues, member = id/queue (a '/'
--                            is never in a queue name), score = lease_expires_at: reap reads
--                            only the expired head (see gmember)
--   schedule   P:schedule    ZSET of every scheduled job across queues, member = id/queue,
--                            score = run_at: promote reads only the due head
--   done:<s>   P:done:<s>    one ZSET per final state (succeeded, dead, cancelled) of every
--                            job in it across queues, member = id/queue, score = finished_at:
--                            prune reads only the due head
--   wait       P:wait:       prefix key; P:wait:<id> is a STRING count of job.wait callers (the
--                            client INCRs it with a TTL), P:wait:<id>:done a LIST a finish
--                            pushes one mark per waiter to, P:wait:any the count of all
--                            waiters (see tell_waiters)
--   paused     P:paused      HASH queue -> paused since (unix seconds): claim takes nothing of
--                            such a queue and look.lua passes over it (see queue_pause.lua)
-- then one block per queue named in ARGV, in the same order, its keys in the order of
-- QUEUE_KEYS in keys.py (queue_keys(b, name) names them):
--   P:q:<queue>:available  ZSET, score = priority, member = tag .. sortable(run_at) .. id
--                          (see member())
--   P:q:<queue>:scheduled  ZSET id, score = run_at
--   P:q:<queue>:running    ZSET id, score = lease_expires_at
--   P:q:<queue>:succeeded|dead|cancelled  ZSET id, score = finished_at
--   P:q:<queue>:jobs       ZSET id, score = id (listing by queue)
--   P:q:<queue>:wake       LIST of wake-up markers that idle workers BLPOP
--   P:q:<queue>:fair       HASH of fair sharing, one round per priority (see fair_tags):
--                          'v:<priority>' -> that round's virtual time, 't:<priority>:<fair key>'
--                          -> that key's last tag in it, 'scan' -> prune's HSCAN cursor; and
--                          'gated' -> how many available jobs have a concurrency or rate key
--                          (see enter_available); 'hold' -> until when claims need not look:
--                          every waiting job is held back by a limit (see claim.lua)
--   P:q:<queue>:due        ZSET of the available ids, score = run_at: the oldest waiting job
--   P:q:<queue>:inbox      LIST of plain jobs enqueue_one wrote but did not index yet, folded
--                          into the indexes above before any script reads them (fold_inbox)
--
-- ARGV: ARGV[1] = number of queue blocks n, ARGV[2..n+1] = their queue names, then the
-- script's own arguments (arg(i)). Queue keys are never built here from data: a script that
-- meets a job of a queue it was not given answers {'need', queue} and the caller retries
-- with that queue's block.

local P_JOB, P_ERR, K_ALL = K.job, K.errors, K.jobs
local K_UNIQUE, K_EXPIRIES, K_QUEUES, K_IDS = K.unique, K.expiries, K.queues, K.ids
local K_WORKERS, K_SEEN, K_CRON = K.workers, K.seen, K.cron
local P_CONC, P_RATE = K.conc, K.rate
local K_LEASES, K_SCHEDULE, P_WAIT = K.leases, K.schedule, K.wait
local KEEP_ERRORS = 20

local NQ = tonumber(ARGV[1])
local Q = {}
local QNAMES = {}
for i = 1, NQ do
  local name = ARGV[1 + i]
  QNAMES[i] = name
  Q[name] = queue_keys(NHEAD + (i - 1) * NQK, name)
end
-- Before anything reads a queue's indexes, its inbox goes into them (see fold_inbox).
for i = 1, NQ do
  local q = Q[QNAMES[i]]
  fold_inbox(q.inbox, K_ALL, K_STATE.available, q.jobs, q.available, q.due, q.fair)
end
local A = 2 + NQ
local function arg(i) return ARGV[A + i - 1] end

-- The member of P:leases and P:schedule: the id and its queue, so reap and promote know which
-- queue blocks to ask for without reading the jobs. Every writer of a queue's running or
-- scheduled ZSET writes these two in step (the per-queue sets stay: stats and listing read them).
local function gmember(q, id) return id .. '/' .. q.name end
local function split_gmember(m) return string.match(m, '^([^/]+)/(.*)$') end
-- P:done:<state> is the same for the finished states (enter, leave, succeed and delete_job
-- write it), read by prune.
local K_GLOBAL = {running = K_LEASES, scheduled = K_SCHEDULE, succeeded = K['done:succeeded'],
  dead = K['done:dead'], cancelled = K['done:cancelled']}

-- The head of a global index (P:leases, P:schedule) scored up to max, at most limit: the
-- entries whose queue's block the call was given, as {id, queue, member}, and the queues whose
-- blocks are missing (the caller answers {'need', ...} and the client sends them). Also the raw
-- head, whose length the caller reports as the entries looked at.
local function due_entries(index, max, limit)
  local r = redis.call('ZRANGEBYSCORE', index, '-inf', max, 'LIMIT', 0, limit)
  local found, need, asked = {}, {}, {}
  for _, m in ipairs(r) do
    local id, qn = split_gmember(m)
    if Q[qn] then
      found[#found + 1] = {id, Q[qn], m}
    elseif not asked[qn] then
      asked[qn] = true
      need[#need + 1] = qn
    end
  end
  return r, found, need
end

-- Copies the entries of a queue's own running, scheduled or finished ZSET scored up to max into
-- the global one (P:leases, P:schedule, P:done:<state>), at most limit: for a store, or a
-- worker, of the version before those existed (see sweep.lua). Only what is due is copied;
-- reap, promote and prune check each job again. Returns how many were copied.
local function sweep_queue(q, state, max, limit)
  local r = redis.call('ZRANGEBYSCORE', q[state], '-inf', max, 'WITHSCORES', 'LIMIT', 0, limit)
  local args = {}
  for k = 1, #r, 2 do
    args[#args + 1] = r[k + 1]
    args[#args + 1] = gmember(q, r[k])
  end
  if #args > 0 then call_many('ZADD', K_GLOBAL[state], args) end
  return #args / 2
end

local function is_unfinished(state)
  return state == 'scheduled' or state == 'available' or state == 'running'
    or state == 'waiting'
end

-- ck, rk: the job's concurrency_key and rate_key as the caller read them with HMGET (false when
-- the job has none). A caller that did not read them passes nil, and they are read here.
local function limit_keys(id, ck, rk)
  if ck == nil or rk == nil then
    local f = redis.call('HMGET', P_JOB .. id, 'concurrency_key', 'rate_key')
    return f[1], f[2]
  end
  return ck, rk
end

-- A queue whose waiting jobs were all held back by limits (claim set 'hold') may have a job
-- to run again: a job became available, or a concurrency slot of a job of it freed.
local function unhold(q) redis.call('HDEL', q.fair, 'hold', 'holdc') end

-- Until when claim's hold on q stands (hold_until in _core.lua), or nil.
local function held_until(q, now) return hold_until(q.fair, P_CONC, now) end

-- Take the job out of its state's sets (not the hash: the caller rewrites that). Every way out
-- of running (ack, retry, kill, release, reap, cancel) comes through here, so this is where a
-- job gives back its concurrency slot; a held-back job may now start, so idle workers are told.
-- ck, rk: see limit_keys (only the concurrency key matters for running, both for available).
local function leave(q, id, state, m, ck, rk)
  if state == 'available' then
    redis.call('ZREM', q.available, m)
    redis.call('ZREM', q.due, id)
    ck, rk = limit_keys(id, ck, rk)
    if ck or rk then redis.call('HINCRBY', q.fair, 'gated', -1) end
  else
    redis.call('ZREM', q[state], id)
    if K_GLOBAL[state] then redis.call('ZREM', K_GLOBAL[state], gmember(q, id)) end
    if state == 'running' then
      if ck == nil then ck = redis.call('HGET', P_JOB .. id, 'concurrency_key') end
      if ck then
        redis.call('ZREM', P_CONC .. ck, id)
        unhold(q)
        wake(q, 1)
      end
    end
  end
  redis.call('ZREM', K_STATE[state], id)
end

-- A job reached a final state: wake its job.wait callers, one mark each on P:wait:<id>:done
-- (stale marks only make a waiter look again). P:wait:any counts every waiter of the store:
-- while nobody waits, a script call that finishes jobs reads that one missing key, once.
local FINAL = {succeeded = true, dead = true, cancelled = true}
local anyone_waits
local function tell_waiters(id)
  if anyone_waits == nil then
    anyone_waits = (tonumber(redis.call('GET', P_WAIT .. 'any') or 0) or 0) > 0
  end
  if not anyone_waits then return end
  local n = tonumber(redis.call('GET', P_WAIT .. id) or 0) or 0
  if n > 0 then
    local done = P_WAIT .. id .. ':done'
    local marks = {}
    for i = 1, math.min(n, 1000) do marks[i] = '1' end
    redis.call('LPUSH', done, unpack(marks))
    redis.call('EXPIRE', done, 300)
  end
end

local function enter(q, id, key, state, score)
  redis.call('ZADD', q[state], score, id)
  if K_GLOBAL[state] then redis.call('ZADD', K_GLOBAL[state], score, gmember(q, id)) end
  redis.call('ZADD', K_STATE[state], id, id)
  redis.call('HSET', key, 'state', state)
  if FINAL[state] then tell_waiters(id) end
end

-- tag: the job's fair_tag (kept through retries, lease expiry and release; redrive gives a
-- fresh one).
-- ck, rk: see limit_keys. A job with either key is counted in the queue's 'gated' field (of
-- P:q:<queue>:fair): while that is 0, claim knows no waiting job has a limit and pops without
-- reading the jobs. Only enter_available adds to it; leave() and claim take away.
local function enter_available(q, id, key, run_at, priority, tag, ck, rk)
  local m = member(tag, run_at, id)
  redis.call('ZADD', q.available, priority, m)
  redis.call('ZADD', q.due, run_at, id)
  redis.call('ZADD', K_STATE.available, id, id)
  redis.call('HSET', key, 'state', 'available', 'm', m)
  unhold(q)
  ck, rk = limit_keys(id, ck, rk)
  if ck or rk then redis.call('HINCRBY', q.fair, 'gated', 1) end
end

-- Fair sharing (start-time fair queuing, backends/base.py). Each (queue, priority) is a round
-- of its own: in P:q:<queue>:fair, 'v:<priority>' is its virtual time (claim raises it to the
-- largest tag it hands out at that priority) and 't:<priority>:<fair key>' the tag of that
-- key's last job in it. Fields 'vtime' and 'k:<fair key>' are the
-- layout before rounds were per priority: nothing reads them, and prune drops them.

-- The tags one script hands out (enqueue to new jobs, redrive to revived ones): each field is
-- read once, tags are given in call order (a batch takes consecutive tags per key), and save()
-- writes the last tags back.
local function fair_tags()
  local cache, dirty = {}, {}
  local function get(q, f)
    local c = cache[q.name]
    if c == nil then
      c = {}
      cache[q.name] = c
      dirty[q.name] = {}
    end
    local v = c[f]
    if v == nil then
      v = tonumber(redis.call('HGET', q.fair, f) or 0)
      c[f] = v
    end
    return v
  end
  local tags = {}
  -- fk: the job's fair key, or false. Without one, a job is a round of its own: vtime + 1.
  function tags.take(q, priority, fk)
    local p = pkey(priority)
    local v = get(q, 'v:' .. p)
    if not fk then return v + 1 end
    local f = 't:' .. p .. ':' .. fk
    local tag = math.max(get(q, f), v) + 1
    cache[q.name][f] = tag
    dirty[q.name][f] = true
    return tag
  end
  function tags.save()
    for qn, fields in pairs(dirty) do
      local args = {}
      for f in pairs(fields) do
        args[#args + 1] = f
        args[#args + 1] = string.format('%.0f', cache[qn][f])
      end
      call_many('HSET', Q[qn].fair, args)
    end
  end
  return tags
end

-- A finished job gives its unique key back, unless a newer job holds it already. (A job that
-- succeeds with a unique_for keeps it: ack skips this, and enqueue reads the window.)
local function free_unique(key, id)
  local uk = redis.call('HGET', key, 'unique_key')
  if uk and redis.call('HGET', K_UNIQUE, uk) == id then
    redis.call('HDEL', K_UNIQUE, uk)
  end
end

-- A newly scheduled job that is now the queue's earliest moves idle workers' next due time.
local function wake_if_first_scheduled(q, id)
  local head = redis.call('ZRANGE', q.scheduled, 0, 0)
  if head[1] == id then wake(q, 1) end
end

-- A time as a JSON number (num() gives '5' for a whole second; JSON readers want 5.0 as a float).
local function jnum(x)
  local s = num(x)
  if not string.find(s, '[.eEn]') then s = s .. '.0' end
  return s
end

-- rest: the JSON members kind, type, message, traceback (encoded by the client, or below).
local function add_error(id, attempt, now, worker_id, rest)
  local wid = 'null'
  if worker_id then wid = cjson.encode(worker_id) end
  local doc = '{"attempt":' .. attempt .. ',"at":' .. jnum(now) .. ',"worker_id":' .. wid .. ','
    .. rest .. '}'
  redis.call('RPUSH', P_ERR .. id, doc)
  redis.call('LTRIM', P_ERR .. id, -KEEP_ERRORS, -1)
end

local function job_data(id)
  return {id, redis.call('HGETALL', P_JOB .. id), redis.call('LRANGE', P_ERR .. id, 0, -1)}
end

-- Scripts that touch every queue need all their blocks. The set shrinks too (forget_queue), so
-- an equal count is not enough: every queue given must still be in it.
local function queues_complete()
  if redis.call('SCARD', K_QUEUES) ~= NQ then return false end
  for i = 1, NQ do
    if redis.call('SISMEMBER', K_QUEUES, QNAMES[i]) == 0 then return false end
  end
  return true
end

-- A queue whose last job was deleted leaves P:queues, so the scripts that go over every queue
-- (stats, purge, redrive, listing) stop paying for it; its fair-sharing rounds go too
-- (no job carries a tag of them). Enqueue names it again (enqueue's SADD, or enqueue_one's for
-- the first job of an inbox: the prelude has folded this queue's inbox, so it is empty).
local function forget_queue_if_empty(q)
  if redis.call('ZCARD', q.jobs) == 0 and redis.call('LLEN', q.inbox) == 0 then
    redis.call('SREM', K_QUEUES, q.name)
    redis.call('DEL', q.fair)
  end
end

-- A job whose id is in a queue's indexes but whose hash is gone (an evicting maxmemory-policy,
-- or a key deleted by hand) can be neither run nor shown, and writing its fields would make a
-- hash with half of them. The scripts that meet one (claim, promote, reap) take it out of
-- every index, so it is met once, and count it in P:expiries under 'missing/<queue>' (a '/' is
-- never in a queue name), instead of failing the whole batch. A member of `available` is not
-- known without the hash: claim, the one script that finds one there, has popped it already.
local function forget_missing(q, id)
  for _, state in ipairs(STATES) do
    if state ~= 'available' then redis.call('ZREM', q[state], id) end
  end
  for _, k in pairs(K_STATE) do redis.call('ZREM', k, id) end
  for _, k in pairs(K_GLOBAL) do redis.call('ZREM', k, gmember(q, id)) end
  redis.call('ZREM', q.due, id)
  redis.call('ZREM', q.jobs, id)
  redis.call('ZREM', K_ALL, id)
  redis.call('DEL', P_JOB .. id, P_ERR .. id)  -- what is left of it: a partial hash, its errors
  redis.call('HINCRBY', K_EXPIRIES, 'missing/' .. q.name, 1)
end

-- Returns how many jobs became available (one whose hash is gone does not).
local function promote_queue(q, now, limit)
  local ids = redis.call('ZRANGEBYSCORE', q.scheduled, '-inf', num(now), 'LIMIT', 0, limit)
  local n = 0
  for _, id in ipairs(ids) do
    local key = P_JOB .. id
    redis.call('ZREM', q.scheduled, id)
    redis.call('ZREM', K_STATE.scheduled, id)
    redis.call('ZREM', K_SCHEDULE, gmember(q, id))
    local f = redis.call('HMGET', key, 'run_at', 'priority', 'fair_tag', 'concurrency_key',
      'rate_key')
    if f[1] then
      enter_available(q, id, key, tonumber(f[1]), tonumber(f[2]), tonumber(f[3] or 0), f[4], f[5])
      n = n + 1
    else
      forget_missing(q, id)
    end
  end
  return n
end

-- Deletes the job with everything that names it: its hash (which holds its step records),
-- its errors, its index entries, and a unique key it still holds (a unique_for window).
local function delete_job(q, id, state)
  free_unique(P_JOB .. id, id)
  redis.call('DEL', P_JOB .. id, P_ERR .. id)
  redis.call('ZREM', q[state], id)
  redis.call('ZREM', K_GLOBAL[state], gmember(q, id))
  redis.call('ZREM', K_STATE[state], id)
  redis.call('ZREM', K_ALL, id)
  redis.call('ZREM', q.jobs, id)
  forget_queue_if_empty(q)
end

-- The lease check every fenced call makes: same token, still running, not expired at now.
-- Returns the job's queue (nil when the lease is not held), then its concurrency key, unique key,
-- unique_for and 'kids' (unsettled children, see _deps.lua) (each false when the job has none),
-- read in the same call.
local function fenced(key, token, now)
  local f = redis.call('HMGET', key, 'state', 'lease_token', 'lease_expires_at', 'queue',
    'concurrency_key', 'unique_key', 'unique_for', 'kids')
  if f[1] ~= 'running' or f[2] ~= token or tonumber(f[3]) < now then return nil end
  return f[4], f[5], f[6], f[7], f[8]
end

-- ZREMs and ZADDs gathered over a batch of jobs and written by flush() in a few calls per key
-- (each redis.call from a script costs a few microseconds on top of the command itself). Only
-- for index sets nothing reads before the flush.
local function index_writes()
  local w, rem, add = {}, {}, {}
  local function list(t, key)
    local l = t[key]
    if l == nil then
      l = {}
      t[key] = l
    end
    return l
  end
  function w.zrem(key, member)
    local l = list(rem, key)
    l[#l + 1] = member
  end
  function w.zadd(key, score, member)
    local l = list(add, key)
    l[#l + 1] = score
    l[#l + 1] = member
  end
  function w.flush()
    for key, l in pairs(rem) do call_many('ZREM', key, l) end
    for key, l in pairs(add) do call_many('ZADD', key, l) end
  end
  return w
end

-- A fenced job's success (ack and ack_many): what leave() and enter() do for running ->
-- succeeded, with the index writes gathered in w (index_writes) and the hash written in one
-- HSET. Keeps the result; frees the unique key unless the job has a unique_for (then enqueue
-- reads finished_at + unique_for, and prune or purge give the key back when they delete the
-- job). last_token lets a client whose reply was lost tell "my ack landed" from "lease lost".
-- ck, uk, ufor: as fenced() returns them.
local function succeed(q, id, key, token, ck, uk, ufor, now, has_result, result, w)
  local t = num(now)
  w.zrem(q.running, id)
  w.zrem(K_STATE.running, id)
  w.zrem(K_LEASES, gmember(q, id))
  if ck then
    redis.call('ZREM', P_CONC .. ck, id)
    unhold(q)
    wake(q, 1)
  end
  redis.call('HDEL', key, 'lease_token', 'lease_expires_at')
  local fields = {'finished_at', t, 'last_token', token, 'last_outcome', 'succeeded', 'state',
    'succeeded'}
  if has_result == '1' then
    fields[#fields + 1] = 'result'
    fields[#fields + 1] = result
  end
  redis.call('HSET', key, unpack(fields))
  w.zadd(q.succeeded, t, id)
  w.zadd(K_GLOBAL.succeeded, t, gmember(q, id))
  w.zadd(K_STATE.succeeded, id, id)
  if uk and not ufor and redis.call('HGET', K_UNIQUE, uk) == id then
    redis.call('HDEL', K_UNIQUE, uk)
  end
  tell_waiters(id)
end

-- ---- end of prelude ----
