-- make_due: the scheduled jobs among the ids become available now, run_at set to now (a bulk
-- "run now", or "retry now" of failed jobs waiting for their backoff). Others are left alone.
-- KEYS: the common header, then the blocks of every queue in P:queues.
-- ARGV: n, queue names; now ('' = the store's clock), then the job ids.
-- Returns {'ok', count} or {'stale'} (nothing changed).
if not queues_complete() then return {'stale'} end
local now = clock(arg(1))
local woken, n = {}, 0
for k = A + 1, #ARGV do
  local id = ARGV[k]
  local key = P_JOB .. id
  local f = redis.call('HMGET', key, 'state', 'queue', 'priority', 'fair_tag',
    'concurrency_key', 'rate_key')
  local q = f[2] and Q[f[2]]
  if f[1] == 'scheduled' and q then
    leave(q, id, 'scheduled')
    redis.call('HSET', key, 'run_at', num(now))
    enter_available(q, id, key, now, tonumber(f[3]), tonumber(f[4] or 0), f[5], f[6])
    woken[q.name] = (woken[q.name] or 0) + 1
    n = n + 1
  end
end
for qn, c in pairs(woken) do wake(Q[qn], c) end
return {'ok', n}
