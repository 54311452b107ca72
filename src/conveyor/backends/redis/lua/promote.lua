-- promote: scheduled jobs whose run_at has come (run_at <= now) become available, earliest
-- first, at most limit. Idempotent. (claim also promotes its own queue before it pops.) An id
-- whose job hash is gone is dropped and not counted (forget_missing).
-- The due jobs are the head of P:schedule (all queues): a call costs O(due + log n) whatever
-- the number of queues.
-- The client reads the head of P:schedule first and sends the blocks of those jobs' queues; the
-- due jobs of the given queues' own scheduled ZSETs are copied into P:schedule first
-- (sweep_queue), as reap does for leases.
-- KEYS: the common header, then the blocks of the queues of the due jobs (see 'need').
-- ARGV: n, queue names; now ('' = the store's clock), limit
-- Returns {'ok', count, entries looked at} or {'need', queue...} (nothing changed).
local now = clock(arg(1))
local limit = tonumber(arg(2))
for _, qn in ipairs(QNAMES) do sweep_queue(Q[qn], 'scheduled', num(now), limit) end
local r, found, need = due_entries(K_SCHEDULE, num(now), limit)
if #need > 0 then return {'need', unpack(need)} end
local woken = {}
local n = 0
for k = 1, #found do
  local id, q = found[k][1], found[k][2]
  local key = P_JOB .. id
  local f = redis.call('HMGET', key, 'run_at', 'priority', 'fair_tag', 'concurrency_key',
    'rate_key', 'state')
  if not f[1] then
    forget_missing(q, id)  -- its hash is gone: see there
  elseif f[6] ~= 'scheduled' then
    redis.call('ZREM', K_SCHEDULE, found[k][3])  -- left scheduled without the index being told
  elseif tonumber(f[1]) > now then
    redis.call('ZADD', K_SCHEDULE, f[1], found[k][3])  -- the index had an old run_at
  else
    leave(q, id, 'scheduled')
    enter_available(q, id, key, tonumber(f[1]), tonumber(f[2]), tonumber(f[3] or 0), f[4], f[5])
    woken[q.name] = (woken[q.name] or 0) + 1
    n = n + 1
  end
end
for qn, c in pairs(woken) do wake(Q[qn], c) end
return {'ok', n, #r}
