-- look (read-only): an idle worker's look at its queues. 'any' (peek): is a job waiting in
-- one of them, or when will the first scheduled one come due? It asks before it blocks and
-- after each wake-up marker (a marker only says something changed). 'all'
-- (Backend.ready_queues): which of them hold a job a claim could take now.
-- Lean: no prelude, four keys a queue, so a worker on thousands of queues looks in one cheap
-- call. A queue's inbox is not folded here (its jobs count as waiting: folding them, which
-- the next claim does, also ends any hold; see fold_inbox in _core.lua).
-- KEYS: P:paused, P:conc: (a prefix, never a key: hold_until reads the keys it names), then
-- per queue its inbox, available, scheduled and fair keys (LOOK_QUEUE_KEYS in keys.py).
-- ARGV: 'any' or 'all'; now ('' = the store's clock); then the queue names.
-- Returns, for 'any': {1} if a job is available or due now, else {0, seconds until the
-- earliest scheduled job is due or a hold ends (see claim.lua), or '' if neither}; for 'all':
-- the names of the queues with a job to claim now, in the given order.
local all = ARGV[1] == 'all'
local now = clock(ARGV[2])
local n = #ARGV - 2
local due_in = nil
local out = {}
-- A paused queue's jobs are nobody's to claim (P:paused): it is passed over, so an idle worker
-- on paused queues sleeps instead of waking to empty claims. (A read per 1,000 queues: unpack
-- has a bound.)
for from = 1, n, 1000 do
  local names = {}
  for i = from, math.min(from + 999, n) do names[#names + 1] = ARGV[i + 2] end
  local paused = redis.call('HMGET', K.paused, unpack(names))
  for j, name in ipairs(names) do
    if not paused[j] then
      local b = 2 + (from + j - 2) * 4
      local ready = redis.call('LLEN', KEYS[b + 1]) > 0
      if not ready and redis.call('ZCARD', KEYS[b + 2]) > 0 then
        -- Jobs wait; unless limits hold them all back (claim's 'hold'), one can be claimed now.
        local hold = hold_until(KEYS[b + 4], K.conc, now)
        ready = not hold
        if hold and (due_in == nil or hold - now < due_in) then due_in = hold - now end
      end
      if not ready then
        local head = redis.call('ZRANGE', KEYS[b + 3], 0, 0, 'WITHSCORES')
        if head[2] then
          local left = tonumber(head[2]) - now
          ready = left <= 0
          if not ready and (due_in == nil or left < due_in) then due_in = left end
        end
      end
      if ready then
        if not all then return {1} end
        out[#out + 1] = name
      end
    end
  end
end
if all then return out end
if due_in == nil then return {0, ''} end
return {0, num(due_in)}
