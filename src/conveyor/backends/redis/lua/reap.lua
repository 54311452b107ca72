-- reap: jobs whose lease expired before now go back to available, or dead when their
-- attempts are used up. Each expiry is recorded as a lease_expired error and counted per
-- queue. A job claimed held that never started ('held' in its hash) goes back uncounted, as a
-- stall ('stalls' + 1), while it has stalled fewer than max_stalls times; past that its expiry
-- counts. Bounded by limit, earliest expiry first; idempotent. A running id whose job hash is
-- gone is dropped from the indexes and not reported (forget_missing).
-- The expired leases are the head of P:leases (all queues), so a call costs O(expired + log n)
-- whatever the number of queues: only the queues of those jobs are needed.
-- The client reads the head of P:leases first and sends the blocks of those jobs' queues, with a
-- few more: the expired leases in the given queues' own running ZSETs are copied into P:leases
-- first (sweep_queue), so a lease written by a worker of the previous version is found.
-- KEYS: the common header, then the blocks of the queues of the expired leases (see 'need').
-- ARGV: n, queue names; now ('' = the store's clock), limit, max_stalls
-- Returns {'ok', {requeued ids}, {dead ids}, entries looked at}, or {'need', queue...} (nothing
-- changed) when a block is missing: of an expired job's queue, or of a waiting child's queue of
-- a job that goes dead (see _deps.lua).
local now = clock(arg(1))
local limit = tonumber(arg(2))
local max_stalls = tonumber(arg(3))
for _, qn in ipairs(QNAMES) do sweep_queue(Q[qn], 'running', '(' .. num(now), limit) end
local r, found, need = due_entries(K_LEASES, '(' .. num(now), limit)
if #need > 0 then return {'need', unpack(need)} end
-- The jobs that go dead with unsettled children: their children's queues must be at hand before
-- anything is written. (Each plan is made again just before it is written: an earlier one of
-- this call may have settled a child they share.)
for k = 1, #found do
  local f = redis.call('HMGET', P_JOB .. found[k][1], 'kids', 'state', 'lease_expires_at', 'held',
    'stalls', 'attempt', 'max_attempts')
  if f[1] and f[2] == 'running' and tonumber(f[3] or 0) < now
      and not (f[4] ~= false and tonumber(f[5] or 0) < max_stalls)
      and tonumber(f[6]) >= tonumber(f[7]) then
    local _, missing = plan_children(found[k][1], 'dead')
    for _, qn in ipairs(missing or {}) do
      if not need[qn] then
        need[qn] = true
        need[#need + 1] = qn
      end
    end
  end
end
if #need > 0 then return {'need', unpack(need)} end
-- rq, dq: the queue of each job in requeued and in dead, in the same order (for the history).
local requeued, dead, woken, rq, dq = {}, {}, {}, {}, {}
for k = 1, #found do
  local id, q = found[k][1], found[k][2]
  local key = P_JOB .. id
  local f = redis.call('HMGET', key, 'attempt', 'max_attempts', 'worker_id', 'run_at', 'priority',
    'fair_tag', 'concurrency_key', 'rate_key', 'state', 'lease_expires_at', 'held', 'stalls',
    'kids')
  if not f[2] then
    forget_missing(q, id)  -- its hash is gone: see there
  elseif f[9] ~= 'running' then
    redis.call('ZREM', K_LEASES, found[k][3])  -- left running without the index being told
  elseif tonumber(f[10] or 0) >= now then
    redis.call('ZADD', K_LEASES, f[10], found[k][3])  -- renewed: the index had an old expiry
  else
    local who = f[3] or '?'
    local held, stalls = f[11], tonumber(f[12] or 0)
    local free = held ~= false and stalls < max_stalls
    local attempt, why = tonumber(f[1]), nil
    local recorded = f[1]  -- the error names the attempt number the lease had
    if held == false then
      why = 'lease expired mid-job: worker ' .. who
        .. ' stopped heartbeating (crashed, killed or stalled)'
    elseif free then
      attempt = attempt - 1
      redis.call('HSET', key, 'attempt', string.format('%d', attempt), 'stalls',
        string.format('%d', stalls + 1))
      why = 'lease expired before the job started (as far as the store knows): worker ' .. who
        .. ' held it (prefetched, or the reply to its claim was lost) and stopped heartbeating;'
        .. ' attempt not counted'
    else
      why = 'lease expired before the job started, ' .. string.format('%d', stalls + 1)
        .. ' times: counted as an attempt; worker ' .. who .. ' stopped heartbeating'
    end
    add_error(id, recorded, now, f[3], '"kind":"lease_expired","type":"LeaseExpired","message":'
      .. cjson.encode(why) .. ',"traceback":""')
    leave(q, id, 'running', nil, f[7])
    redis.call('HDEL', key, 'lease_token', 'lease_expires_at', 'held')
    if not free and attempt >= tonumber(f[2]) then
      local plan = children_plan(id, f[13], 'dead')
      redis.call('HSET', key, 'finished_at', num(now))
      enter(q, id, key, 'dead', now)
      free_unique(key, id)
      if plan then apply_children(plan, now) end
      dead[#dead + 1] = id
      dq[#dq + 1] = q.name
    else
      enter_available(q, id, key, tonumber(f[4]), tonumber(f[5]), tonumber(f[6] or 0), f[7], f[8])
      woken[q.name] = (woken[q.name] or 0) + 1
      requeued[#requeued + 1] = id
      rq[#rq + 1] = q.name
    end
    redis.call('HINCRBY', K_EXPIRIES, q.name, 1)
  end
end
for qn, n in pairs(woken) do wake(Q[qn], n) end
return {'ok', requeued, dead, #r, rq, dq}
