-- stats (read-only): per-queue counts by state (ZCARD, not a scan), due scheduled jobs counted
-- as available, the run_at of the oldest waiting job, lease expiries; workers seen recently.
-- KEYS: the common header, then the blocks of every queue in P:queues.
-- ARGV: n, queue names; now ('' = the store's clock), worker_ttl
-- Returns {'ok', now, {per queue: name, scheduled, available, running, succeeded, dead,
--   cancelled, due, oldest waiting run_at or '', expiries or '', running jobs past their
--   lease (not yet reaped)}..., {worker id, info,
--   last_seen}...} or {'stale'}.
if not queues_complete() then return {'stale'} end
local now = clock(arg(1))
local queues = {}
for _, qn in ipairs(QNAMES) do
  local q = Q[qn]
  local due = redis.call('ZCOUNT', q.scheduled, '-inf', num(now))
  local oldest = nil
  if due > 0 then
    oldest = tonumber(redis.call('ZRANGEBYSCORE', q.scheduled, '-inf', num(now), 'WITHSCORES', 'LIMIT', 0, 1)[2])
  end
  -- The oldest available job heads P:q:<queue>:due (available ids by run_at). The claim order
  -- puts fair tags before run_at, so the head of `available` need not be the oldest job.
  local head = redis.call('ZRANGE', q.due, 0, 0, 'WITHSCORES')
  if head[1] then
    local r = tonumber(head[2])
    if oldest == nil or r < oldest then oldest = r end
  end
  local oldest_s = ''
  if oldest ~= nil then oldest_s = num(oldest) end
  queues[#queues + 1] = {
    qn, redis.call('ZCARD', q.scheduled), redis.call('ZCARD', q.available),
    redis.call('ZCARD', q.running), redis.call('ZCARD', q.succeeded), redis.call('ZCARD', q.dead),
    redis.call('ZCARD', q.cancelled), due, oldest_s, redis.call('HGET', K_EXPIRIES, qn) or '',
    redis.call('ZCOUNT', q.running, '-inf', '(' .. num(now)),
  }
end
-- A queue forgotten once its jobs were deleted still shows its lease expiries, as the SQL stores
-- keep their counters.
local counted = redis.call('HGETALL', K_EXPIRIES)
for k = 1, #counted, 2 do
  local qn = counted[k]
  if not Q[qn] and not string.find(qn, '/', 1, true) then
    queues[#queues + 1] = {qn, 0, 0, 0, 0, 0, 0, 0, '', counted[k + 1], 0}
  end
end
local workers = {}
local seen = redis.call('ZRANGEBYSCORE', K_SEEN, num(now - tonumber(arg(2))), '+inf', 'WITHSCORES')
for k = 1, #seen, 2 do
  local info = redis.call('HGET', K_WORKERS, seen[k])
  if info then workers[#workers + 1] = {seen[k], info, seen[k + 1]} end
end
return {'ok', num(now), queues, workers}
