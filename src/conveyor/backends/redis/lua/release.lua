-- release: give running jobs back unrun (graceful shutdown): available at once, the attempt
-- not counted. Only the token is checked: a lease that ran out but was not reaped yet is
-- still this worker's to give back. Stale leases are skipped.
-- KEYS: the common header, then the blocks of the jobs' queues.
-- ARGV: n, queue names; now (unused: nothing here depends on time), then (id, token) pairs.
-- Returns {'ok', released ids...} in the order given, or {'need', queue...} (nothing changed).
local mine, need, seen = {}, {}, {}
for i = A + 1, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local f = redis.call('HMGET', P_JOB .. id, 'state', 'lease_token', 'queue')
  if f[1] == 'running' and f[2] == token and not seen[id] then
    seen[id] = true
    if Q[f[3]] then mine[#mine + 1] = {id, Q[f[3]]} else need[#need + 1] = f[3] end
  end
end
if #need > 0 then return {'need', unpack(need)} end
local out, woken = {'ok'}, {}
for _, r in ipairs(mine) do
  local id, q = r[1], r[2]
  local key = P_JOB .. id
  local f = redis.call('HMGET', key, 'run_at', 'priority', 'fair_tag', 'concurrency_key',
    'rate_key')
  leave(q, id, 'running', nil, f[4])
  redis.call('HINCRBY', key, 'attempt', -1)
  redis.call('HDEL', key, 'lease_token', 'lease_expires_at', 'worker_id', 'held')
  enter_available(q, id, key, tonumber(f[1]), tonumber(f[2]), tonumber(f[3] or 0), f[4], f[5])
  woken[q.name] = (woken[q.name] or 0) + 1
  out[#out + 1] = id
end
for qn, n in pairs(woken) do wake(Q[qn], n) end
return out
