-- heartbeat: extend every lease still held to now + lease_s (in the queue's running ZSET, and
-- in P:conc:<key> for a job with a concurrency key), and mark the jobs the worker no longer
-- holds unstarted as started (their 'held' field goes: reap counts their expiry from now on).
-- KEYS: the common header, then the blocks of the queues the leases' jobs belong to.
-- ARGV: n, queue names; now ('' = the store's clock), lease_s, then (id, token, held) triples
--   (held: '1' while the job waits in the worker's prefetch, else '0').
-- Returns {'ok', lost ids...}, or {'need', queue...} (nothing changed) when a held job's
-- queue block is missing.
local now = clock(arg(1))
local expires = now + tonumber(arg(2))
local lost, held, need = {}, {}, {}
for i = A + 2, #ARGV, 3 do
  local id, token = ARGV[i], ARGV[i + 1]
  local qn, ck = fenced(P_JOB .. id, token, now)
  if not qn then
    lost[#lost + 1] = id
  elseif Q[qn] then
    held[#held + 1] = {id, Q[qn], ck, ARGV[i + 2] == '1'}
  else
    need[#need + 1] = qn
  end
end
if #need > 0 then return {'need', unpack(need)} end
for _, h in ipairs(held) do
  redis.call('HSET', P_JOB .. h[1], 'lease_expires_at', num(expires))
  if not h[4] then redis.call('HDEL', P_JOB .. h[1], 'held') end
  redis.call('ZADD', h[2].running, 'XX', expires, h[1])
  redis.call('ZADD', K_LEASES, expires, gmember(h[2], h[1]))
  if h[3] then redis.call('ZADD', P_CONC .. h[3], expires, h[1]) end
end
return {'ok', unpack(lost)}
