-- claim: lease up to `limit` jobs of one queue, lowest (priority, fair_tag, run_at, id) first,
-- after promoting the queue's scheduled jobs that are due, and raise the virtual time of each
-- priority claimed ('v:<priority>' of P:q:<queue>:fair) to the largest fair tag handed out at
-- that priority. A claimed job stays in Redis (in the running ZSET, scored by lease expiry)
-- until it is finished, so a crash loses nothing.
-- Concurrency and rate limits (backends/base.py): the fast path pops the head of the queue. If
-- the queue has jobs with a concurrency or rate key waiting (its 'gated' count) and any popped
-- job has one, the pops are put back as they were and the queue is walked in order instead, up
-- to `scan` members, passing over the jobs whose key is at its limit (they stay where they are,
-- attempts untouched). A claimed job with a concurrency key joins P:conc:<key>; one with a rate
-- key adds its claim to P:rate:<key>.
-- A walk that admits nothing records in the queue's 'hold' field (P:q:<queue>:fair) when it is
-- worth looking again: when the earliest rate window met ends, or at most HOLD_S ahead for a
-- full concurrency key, with the full keys (up to HOLD_KEYS of them) and their running counts,
-- so a slot freed by a job of another queue sharing the key ends it too. Until then claims
-- answer at once without walking, and look.lua tells idle workers to sleep until then, so a
-- held-back head costs one walk per hold, not one per idle worker per poll. Whatever may let a
-- job run sooner clears it (unhold in _common.lua): a job becoming available, a slot of a job
-- of this queue freed. HOLD_S bounds the wait for a slot freed by a job of another queue
-- sharing a key when the walk met more full keys than it names (that queue's keys are not at
-- hand where the slot frees).
-- KEYS: the common header, then the block of the queue.
-- ARGV: 1, queue; now ('' = the store's clock), limit, lease_s, worker_id, scan (CLAIM_SCAN:
--   most waiting jobs the walk looks at), start (the first `start` jobs claimed start at once;
--   the others are held in the worker's prefetch: their hash gets 'held' = 1 until a heartbeat
--   says they started, and reap gives them back uncounted), then `limit` lease tokens made by
--   the client (Lua's math.random is not a safe source of them; they begin with the claim's id).
-- Returns {} when the queue is paused; {'empty', seconds until its earliest scheduled job is due,
-- or ''} when it holds no waiting job (the idle wait that follows an empty claim needs no look
-- of its own first: look.lua would answer the same); {'hold', until, entries walked} when limits
-- hold every waiting job back (see above); else {now, lease expiry, then one {id, base, extra, errors} per
-- claimed job, in claim order; the n-th job returned holds the n-th token}. A job whose hash is
-- gone is dropped from the indexes and not returned (forget_missing). base is the values of
-- BASE (below), in that order, and extra is empty; or, for a job with other fields, base is
-- empty and extra is the job's hash as field, value pairs, without what the claiming worker
-- knows already (its queue, state, attempted_at = now, worker_id, lease_token = its token in
-- claim order, lease_expires_at, held) or never reads (fair_tag). Most jobs have no other
-- field, and then the hash is not read whole: every string of the reply costs Redis a
-- conversion and the worker a parse (a large part of each job's cost: docs/benchmarks.md,
-- Design measurements), and a value without its field name is half the strings.
local q = Q[QNAMES[1]]
local now = clock(arg(1))
local limit = tonumber(arg(2))
local expires = now + tonumber(arg(3))
local worker_id = arg(4)
local scan = tonumber(arg(5))
local HOLD_S, HOLD_KEYS = 5, 16
local start = tonumber(arg(6))
promote_queue(q, now, 1000)
-- A paused queue (P:paused) is claimed from by nobody; its due jobs were promoted all the same.
if redis.call('HEXISTS', K.paused, q.name) == 1 then return {} end
local hold = held_until(q, now)
if hold then return {'hold', num(hold), 0} end
local popped = redis.call('ZPOPMIN', q.available, limit)
if #popped == 0 then
  redis.call('HDEL', q.fair, 'gated')  -- nothing waits: nothing is gated
  local head = redis.call('ZRANGE', q.scheduled, 0, 0, 'WITHSCORES')
  return {'empty', head[2] and num(tonumber(head[2]) - now) or ''}
end

-- The ZSET score is the job's priority. The virtual time of the first popped job's priority
-- is read with the gated count: a claim seldom spans priorities, and the rounds of any others
-- it meets are read at the end.
local p1 = popped[2]
local vf1 = 'v:' .. pkey(p1)
local fair = redis.call('HMGET', q.fair, 'gated', vf1)
local gated_n, v1 = tonumber(fair[1] or 0), tonumber(fair[2] or 0)

-- Fast path: the members popped. The jobs' hashes are read only when some waiting job of the
-- queue has a limit. picked: the members claimed; scores: their priorities (ZSET scores).
local picked, scores = {}, {}
local gated = false
for k = 1, #popped, 2 do
  local m = popped[k]
  if gated_n ~= 0 then
    local f = redis.call('HMGET', P_JOB .. id_of(m), 'concurrency_key', 'rate_key')
    if f[1] or f[2] then
      gated = true
      break
    end
  end
  picked[#picked + 1] = m
  scores[#picked] = popped[k + 1]
end

local limits = {}
if gated then
  local back = {}
  for k = 1, #popped, 2 do
    back[#back + 1] = popped[k + 1]
    back[#back + 1] = popped[k]
  end
  call_many('ZADD', q.available, back)

  -- Running jobs holding a slot of concurrency key ck. Members whose lease ran out before now
  -- are checked against their job's hash and dropped unless the job is still running (its
  -- worker may just be late; the reaper decides), so a slot could never stay taken by a job
  -- that left running some other way. The rest are current: claim adds them, leave() removes
  -- them, heartbeat rescores them.
  local function conc_running(ck)
    local k = P_CONC .. ck
    local old = redis.call('ZRANGEBYSCORE', k, '-inf', '(' .. num(now))
    for _, id in ipairs(old) do
      if redis.call('HGET', P_JOB .. id, 'state') ~= 'running' then redis.call('ZREM', k, id) end
    end
    return redis.call('ZCARD', k)
  end

  -- Claims of rate key rk whose window is still open at now (a window ends after now: it is
  -- open at its old end). Closed ones are dropped first.
  local function rate_claims(rk)
    local k = P_RATE .. rk
    redis.call('ZREMRANGEBYSCORE', k, '-inf', num(now))
    return redis.call('ZCARD', k)
  end

  -- Slow path: walk the queue in claim order, admitting a job only while its concurrency key
  -- has fewer running jobs than its limit and its rate key fewer open claims than its limit
  -- (counting the jobs admitted here). `limits` holds, by pick index, {concurrency key, rate
  -- key, rate period} of the admitted jobs that have limits.
  picked, scores = {}, {}
  local running_n, rate_n = {}, {}
  local hold_at = math.huge  -- the hold if nothing is admitted: the earliest a blocker may clear
  local full, n_full = {}, 0  -- concurrency keys met at their limit: key, running count...
  local seen, page = 0, limit
  while #picked < limit and seen < scan do
    local n = math.min(page, scan - seen)
    local batch = redis.call('ZRANGE', q.available, seen, seen + n - 1, 'WITHSCORES')
    seen = seen + #batch / 2
    for b = 1, #batch, 2 do
      if #picked >= limit then break end
      local m = batch[b]
      local f = redis.call('HMGET', P_JOB .. id_of(m), 'concurrency_key', 'concurrency_limit',
        'rate_key', 'rate_limit', 'rate_period')
      local ck, rk = f[1], f[3]
      local ok = true
      if ck then
        if running_n[ck] == nil then running_n[ck] = conc_running(ck) end
        ok = running_n[ck] < tonumber(f[2])
        if not ok and full[ck] == nil then
          hold_at = math.min(hold_at, now + HOLD_S)
          full[ck] = true
          n_full = n_full + 1
        end
      end
      if ok and rk then
        if rate_n[rk] == nil then rate_n[rk] = rate_claims(rk) end
        ok = rate_n[rk] < tonumber(f[4])
        if not ok then
          local first = redis.call('ZRANGE', P_RATE .. rk, 0, 0, 'WITHSCORES')
          if first[2] then hold_at = math.min(hold_at, tonumber(first[2])) end
        end
      end
      if ok then
        picked[#picked + 1] = m
        scores[#picked] = batch[b + 1]
        if ck or rk then
          limits[#picked] = {ck, rk, tonumber(f[5])}
          if ck then running_n[ck] = running_n[ck] + 1 end
          if rk then rate_n[rk] = rate_n[rk] + 1 end
        end
      end
    end
    if #batch < 2 * n then break end
    page = math.max(page, 200)  -- past the head, look further in bigger steps
  end
  if #picked == 0 then
    if hold_at == math.huge then hold_at = now + HOLD_S end
    if hold_at > now then
      redis.call('HSET', q.fair, 'hold', num(hold_at))
      if n_full <= HOLD_KEYS then
        local named = {}
        for ck in pairs(full) do
          named[#named + 1] = ck
          named[#named + 1] = running_n[ck]
        end
        redis.call('HSET', q.fair, 'holdc', cjson.encode(named))
      else
        redis.call('HDEL', q.fair, 'holdc')
      end
    end
    return {'hold', num(hold_at), seen}
  end
  call_many('ZREM', q.available, picked)
elseif #popped < 2 * limit and gated_n ~= 0 then
  redis.call('HDEL', q.fair, 'gated')  -- the queue is empty now, and none of it was gated
end

-- BASE: the fields whose values the reply gives in this order; fair_tag is read with them only
-- to know it is there (the reply leaves it out).
local BASE = {'task', 'args', 'priority', 'run_at', 'attempt', 'max_attempts', 'timeout_s', 'meta',
  'created_at', 'uid', 'fair_tag'}
local NBASE, ATTEMPT = #BASE, 5  -- BASE[ATTEMPT] == 'attempt'
-- OMIT: what the reply never sends. PLAIN: how many fields a claimed job has when it has
-- nothing beyond BASE and OMIT (fair_tag is in both).
local OMIT = {queue = true, state = true, attempted_at = true, worker_id = true, lease_token = true,
  lease_expires_at = true, fair_tag = true, held = true}
local PLAIN = NBASE
for name in pairs(OMIT) do
  if name ~= 'fair_tag' and name ~= 'held' then PLAIN = PLAIN + 1 end
end
local out, ids, running, states, leases = {}, {}, {}, {}, {}
local rated, n_gated = {}, 0
-- The largest tag claimed at priority p1, and at any other priority (by ZSET score).
local top1, tops = -1, nil
local n_at, e_at = num(now), num(expires)
out[1], out[2] = n_at, e_at
local n_out = 0
for i, m in ipairs(picked) do
  local id = id_of(m)
  local key = P_JOB .. id
  local base = redis.call('HMGET', key, unpack(BASE))
  local held = false
  if not base[1] then
    forget_missing(q, id)  -- its hash is gone (see there): the rest of the batch goes on
  else
    n_out = n_out + 1
    local token = arg(6 + n_out)  -- the tokens go to the jobs returned, in order
    local tag, score = tag_of(m), scores[i]
    if score == p1 then
      if tag > top1 then top1 = tag end
    else
      tops = tops or {}
      if tops[score] == nil or tag > tops[score] then tops[score] = tag end
    end
    local complete = true
    for k = 1, NBASE do
      if not base[k] then complete = false end
    end
    base[NBASE] = nil
    local attempt = tonumber(base[ATTEMPT] or 0) + 1
    local attempt_s = string.format('%d', attempt)
    base[ATTEMPT] = attempt_s
    held = n_out > start  -- the first `start` jobs returned start at once
    if held then
      redis.call('HSET', key, 'state', 'running', 'attempted_at', n_at, 'worker_id', worker_id,
        'lease_token', token, 'lease_expires_at', e_at, 'attempt', attempt_s, 'held', '1')
      redis.call('HDEL', key, 'm')
    else
      redis.call('HSET', key, 'state', 'running', 'attempted_at', n_at, 'worker_id', worker_id,
        'lease_token', token, 'lease_expires_at', e_at, 'attempt', attempt_s)
      redis.call('HDEL', key, 'm', 'held')
    end
    local lim = limits[i]
    if lim then
      n_gated = n_gated + 1
      if lim[1] then redis.call('ZADD', P_CONC .. lim[1], e_at, id) end
      if lim[2] then
        redis.call('ZADD', P_RATE .. lim[2], num(now + lim[3]), id .. ':' .. token)
        rated[lim[2]] = true
      end
    end
    ids[#ids + 1] = id
    running[#running + 1] = e_at
    running[#running + 1] = id
    leases[#leases + 1] = e_at
    leases[#leases + 1] = gmember(q, id)
    states[#states + 1] = id
    states[#states + 1] = id
    -- A job has error records only after a failed attempt (then attempt was >= 1 before this
    -- claim) or once redriven (attempt back to 0, records kept): the others skip the LRANGE.
    local extra, errors = {}, {}
    local look = attempt > 1
    -- With every field of BASE there (claim just wrote OMIT's others), the count tells whether
    -- the hash holds more. If it does (a unique or fair key, limits, step records, a redrive...),
    -- or lacks one (a hash of an older layout), the reply sends it whole, base empty.
    if not complete or redis.call('HLEN', key) ~= PLAIN + (held and 1 or 0) then
      base = {}
      local h = redis.call('HGETALL', key)
      for f = 1, #h, 2 do
        local name = h[f]
        if not OMIT[name] then
          extra[#extra + 1] = name
          extra[#extra + 1] = h[f + 1]
          if name == 'redriven' then look = true end
        end
      end
    end
    if look then errors = redis.call('LRANGE', P_ERR .. id, 0, -1) end
    out[#out + 1] = {id, base, extra, errors}
  end
end
if n_gated > 0 then redis.call('HINCRBY', q.fair, 'gated', -n_gated) end
-- A rate key lives as long as its last open window, so an idle key vanishes by itself. (PEXPIRE
-- is relative: right whether `now` is the store's clock or injected.)
for rk in pairs(rated) do
  local last = redis.call('ZRANGE', P_RATE .. rk, -1, -1, 'WITHSCORES')
  local ms = math.min(math.max(math.ceil((tonumber(last[2]) - now) * 1000), 0) + 1, 1e15)
  redis.call('PEXPIRE', P_RATE .. rk, string.format('%.0f', ms))
end
call_many('ZREM', K_STATE.available, ids)
call_many('ZREM', q.due, ids)
call_many('ZADD', q.running, running)
call_many('ZADD', K_LEASES, leases)
call_many('ZADD', K_STATE.running, states)
if top1 > v1 then redis.call('HSET', q.fair, vf1, string.format('%.0f', top1)) end
if tops then
  for score, tag in pairs(tops) do
    local vf = 'v:' .. pkey(score)
    if tag > tonumber(redis.call('HGET', q.fair, vf) or 0) then
      redis.call('HSET', q.fair, vf, string.format('%.0f', tag))
    end
  end
end
return out
