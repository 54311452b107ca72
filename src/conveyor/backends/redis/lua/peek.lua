-- peek (read-only): is a job waiting in one of the given queues, or when will the first
-- scheduled one come due? An idle worker asks before it blocks and after each wake-up marker
-- (a marker only says something changed).
-- KEYS: the common header, then the blocks of the queues to look at.
-- ARGV: n, queue names; now ('' = the store's clock)
-- Returns {1} if a job is available or due now, else {0, seconds until the earliest scheduled
-- job is due or a hold ends (see claim.lua), or '' if neither}.
local now = clock(arg(1))
local due_in = nil
-- A paused queue's jobs are nobody's to claim (P:paused): it is passed over, so an idle worker
-- on paused queues sleeps instead of waking to empty claims. (One read for all of them.)
local paused = redis.call('HMGET', K.paused, unpack(QNAMES))
for i, qn in ipairs(QNAMES) do
  local q = Q[qn]
  if not paused[i] then
    if redis.call('ZCARD', q.available) > 0 then
      -- Jobs wait; unless limits hold them all back (claim's 'hold'), one can be claimed now.
      local hold = held_until(q, now)
      if not hold then return {1} end
      if due_in == nil or hold - now < due_in then due_in = hold - now end
    end
    local head = redis.call('ZRANGE', q.scheduled, 0, 0, 'WITHSCORES')
    if head[2] then
      local left = tonumber(head[2]) - now
      if left <= 0 then return {1} end
      if due_in == nil or left < due_in then due_in = left end
    end
  end
end
if due_in == nil then return {0, ''} end
return {0, num(due_in)}
