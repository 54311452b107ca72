-- reap: jobs whose lease expired before now go back to available, or dead when their
-- attempts are used up. Each expiry is recorded as a lease_expired error and counted per
-- queue. Bounded by limit, earliest expiry first; idempotent. A running id whose job hash is
-- gone is dropped from the indexes and not reported (forget_missing).
-- KEYS: the common header, then the blocks of every queue in P:queues.
-- ARGV: n, queue names; now ('' = the store's clock), limit
-- Returns {'ok', {requeued ids}, {dead ids}}, or {'stale'} (nothing changed) when the queue
-- list is not complete.
if not queues_complete() then return {'stale'} end
local now = clock(arg(1))
local limit = tonumber(arg(2))
local found = {}
for _, qn in ipairs(QNAMES) do
  local r = redis.call('ZRANGEBYSCORE', Q[qn].running, '-inf', '(' .. num(now), 'WITHSCORES', 'LIMIT', 0, limit)
  for k = 1, #r, 2 do found[#found + 1] = {r[k], tonumber(r[k + 1]), Q[qn]} end
end
table.sort(found, function(a, b) return a[2] < b[2] end)
local requeued, dead, woken = {}, {}, {}
for k = 1, math.min(limit, #found) do
  local id, q = found[k][1], found[k][3]
  local key = P_JOB .. id
  local f = redis.call('HMGET', key, 'attempt', 'max_attempts', 'worker_id', 'run_at', 'priority', 'fair_tag',
    'concurrency_key', 'rate_key')
  if not f[2] then
    forget_missing(q, id)  -- its hash is gone: see there
  else
    local who = f[3] or '?'
    add_error(id, f[1], now, f[3], '"kind":"lease_expired","type":"LeaseExpired","message":'
      .. cjson.encode('lease expired: worker ' .. who .. ' stopped heartbeating (crashed, killed or stalled)')
      .. ',"traceback":""')
    leave(q, id, 'running', nil, f[7])
    redis.call('HDEL', key, 'lease_token', 'lease_expires_at')
    if tonumber(f[1]) >= tonumber(f[2]) then
      redis.call('HSET', key, 'finished_at', num(now))
      enter(q, id, key, 'dead', now)
      free_unique(key, id)
      dead[#dead + 1] = id
    else
      enter_available(q, id, key, tonumber(f[4]), tonumber(f[5]), tonumber(f[6] or 0), f[7], f[8])
      woken[q.name] = (woken[q.name] or 0) + 1
      requeued[#requeued + 1] = id
    end
    redis.call('HINCRBY', K_EXPIRIES, q.name, 1)
  end
end
for qn, n in pairs(woken) do wake(Q[qn], n) end
return {'ok', requeued, dead}
