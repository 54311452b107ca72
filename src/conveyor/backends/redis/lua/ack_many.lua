-- ack_many: ack.lua for a batch of jobs in one call (a busy worker's finished jobs), each
-- fenced on its own: one job's lost lease changes nothing for the others.
-- KEYS: the common header, then the blocks of the jobs' queues (guesses; see 'need').
-- ARGV: n, queue names; now ('' = the store's clock), then per job: id, token, has_result
--   ('1'/'0'), result.
-- Returns one reply per job, in order: 'ok', 'lost' (nothing changed) or the name of the job's
-- queue when its block was not sent (nothing changed for that job; ack it alone), or a waiting
-- child's queue (see _deps.lua).
local now = clock(arg(1))
local out = {}
local w = index_writes()
local i = 2
while arg(i) do
  local id, token = arg(i), arg(i + 1)
  local key = P_JOB .. id
  local qn, ck, uk, ufor, kids = fenced(key, token, now)
  local plan, need
  if qn and Q[qn] then plan, need = children_plan(id, kids, 'succeeded') end
  if not qn then
    out[#out + 1] = 'lost'
  elseif not Q[qn] then
    out[#out + 1] = 'need:' .. qn
  elseif need then
    out[#out + 1] = 'need:' .. need[1]
  else
    succeed(Q[qn], id, key, token, ck, uk, ufor, now, arg(i + 2), arg(i + 3), w)
    if plan then apply_children(plan, now) end
    out[#out + 1] = 'ok'
  end
  i = i + 4
end
w.flush()
return out
