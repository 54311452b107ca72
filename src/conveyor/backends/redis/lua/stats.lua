-- stats (read-only): per-queue counts by state (ZCARD, not a scan), due scheduled jobs counted
-- as available, the run_at of the oldest waiting job, lease expiries; workers seen recently.
-- Every record is a flat list of name, value pairs (the client reads it into a dict), so a new
-- state or figure moves no other one.
-- KEYS: the common header, then the blocks of every queue in P:queues.
-- ARGV: n, queue names; now ('' = the store's clock), worker_ttl
-- Returns {'ok', {'now', now, 'queues', {queue record}..., 'workers', {worker record}...}} or
-- {'stale'}. A queue record: queue (its name), one count per state in STATES (by the state's
-- name), due (scheduled jobs due now), oldest (oldest waiting run_at, or ''), expiries (or
-- ''), expired (running jobs past their lease, not yet reaped); a queue forgotten since has
-- its name and expiries only. A worker record: id, info (JSON), last_seen. paused: the paused
-- queues, as queue, since pairs (P:paused).
if not queues_complete() then return {'stale'} end
local now = clock(arg(1))
local queues = {}
for _, qn in ipairs(QNAMES) do
  local q = Q[qn]
  local due = redis.call('ZCOUNT', q.scheduled, '-inf', num(now))
  local oldest = nil
  if due > 0 then
    oldest = tonumber(redis.call('ZRANGEBYSCORE', q.scheduled, '-inf', num(now), 'WITHSCORES',
      'LIMIT', 0, 1)[2])
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
  local rec = {'queue', qn}
  for _, state in ipairs(STATES) do
    rec[#rec + 1] = state
    rec[#rec + 1] = redis.call('ZCARD', q[state])
  end
  rec[#rec + 1] = 'due'
  rec[#rec + 1] = due
  rec[#rec + 1] = 'oldest'
  rec[#rec + 1] = oldest_s
  rec[#rec + 1] = 'expiries'
  rec[#rec + 1] = redis.call('HGET', K_EXPIRIES, qn) or ''
  rec[#rec + 1] = 'expired'
  rec[#rec + 1] = redis.call('ZCOUNT', q.running, '-inf', '(' .. num(now))
  queues[#queues + 1] = rec
end
-- A queue forgotten once its jobs were deleted still shows its lease expiries, as the SQL stores
-- keep their counters.
local counted = redis.call('HGETALL', K_EXPIRIES)
for k = 1, #counted, 2 do
  local qn = counted[k]
  if not Q[qn] and not string.find(qn, '/', 1, true) then
    queues[#queues + 1] = {'queue', qn, 'expiries', counted[k + 1]}
  end
end
local workers = {}
local seen = redis.call('ZRANGEBYSCORE', K_SEEN, num(now - tonumber(arg(2))), '+inf', 'WITHSCORES')
for k = 1, #seen, 2 do
  local info = redis.call('HGET', K_WORKERS, seen[k])
  if info then workers[#workers + 1] = {'id', seen[k], 'info', info, 'last_seen', seen[k + 1]} end
end
return {'ok', {'now', num(now), 'queues', queues, 'workers', workers,
  'paused', redis.call('HGETALL', K.paused)}}
