-- promote: scheduled jobs whose run_at has come (run_at <= now) become available, earliest
-- first, at most limit. Idempotent. (claim also promotes its own queue before it pops.) An id
-- whose job hash is gone is dropped and not counted (forget_missing).
-- KEYS: the common header, then the blocks of every queue in P:queues.
-- ARGV: n, queue names; now ('' = the store's clock), limit
-- Returns {'ok', count} or {'stale'} (nothing changed).
if not queues_complete() then return {'stale'} end
local now = clock(arg(1))
local limit = tonumber(arg(2))
local found = {}
for _, qn in ipairs(QNAMES) do
  local r = redis.call('ZRANGEBYSCORE', Q[qn].scheduled, '-inf', num(now), 'WITHSCORES', 'LIMIT', 0, limit)
  for k = 1, #r, 2 do found[#found + 1] = {r[k], tonumber(r[k + 1]), Q[qn]} end
end
table.sort(found, function(a, b) return a[2] < b[2] end)
local woken = {}
local n = 0
for k = 1, math.min(limit, #found) do
  local id, q = found[k][1], found[k][3]
  local key = P_JOB .. id
  local f = redis.call('HMGET', key, 'run_at', 'priority', 'fair_tag', 'concurrency_key', 'rate_key')
  if f[1] then
    leave(q, id, 'scheduled')
    enter_available(q, id, key, tonumber(f[1]), tonumber(f[2]), tonumber(f[3] or 0), f[4], f[5])
    woken[q.name] = (woken[q.name] or 0) + 1
    n = n + 1
  else
    forget_missing(q, id)  -- its hash is gone: see there
  end
end
for qn, c in pairs(woken) do wake(Q[qn], c) end
return {'ok', n}
