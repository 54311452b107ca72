-- retry: record a failed attempt and make the job due again at now + delay (scheduled if
-- delay > 0, else available), or dead if its attempts are used up. Fenced like ack.
-- KEYS: the common header, then the block of the job's queue (a guess; see 'need').
-- ARGV: n, queue names; now ('' = the store's clock), id, token, delay (>= 0), error members
--   (JSON text of "kind", "type", "message", "traceback", without braces)
-- Returns {'ok', new state}, {'lost'} or {'need', queue...} (its queue, or, when it goes dead,
-- its waiting children's); the last two change nothing.
local now = clock(arg(1))
local id, token = arg(2), arg(3)
local delay = tonumber(arg(4))
local key = P_JOB .. id
local qn, ck, _, _, kids = fenced(key, token, now)
if not qn then return {'lost'} end
local q = Q[qn]
if not q then return {'need', qn} end
local f = redis.call('HMGET', key, 'attempt', 'max_attempts', 'worker_id', 'priority', 'fair_tag',
  'rate_key')
local plan
if tonumber(f[1]) >= tonumber(f[2]) then
  local need
  plan, need = children_plan(id, kids, 'dead')
  if need then return {'need', unpack(need)} end
end
add_error(id, f[1], now, f[3], arg(5))
leave(q, id, 'running', nil, ck)
redis.call('HDEL', key, 'lease_token', 'lease_expires_at')
local state
if tonumber(f[1]) >= tonumber(f[2]) then
  state = 'dead'
  redis.call('HSET', key, 'finished_at', num(now))
  enter(q, id, key, 'dead', now)
  free_unique(key, id)
  if plan then apply_children(plan, now) end
else
  local run_at = now + delay
  redis.call('HSET', key, 'run_at', num(run_at))
  if delay > 0 then
    state = 'scheduled'
    enter(q, id, key, 'scheduled', run_at)
    wake_if_first_scheduled(q, id)
  else
    state = 'available'
    enter_available(q, id, key, run_at, tonumber(f[4]), tonumber(f[5] or 0), ck, f[6])
    wake(q, 1)
  end
end
redis.call('HSET', key, 'last_token', token, 'last_outcome', state)
return {'ok', state}
