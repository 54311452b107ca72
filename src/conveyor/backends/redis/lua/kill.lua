-- kill: record a failed attempt and send the job to the dead-letter queue at once (Reject,
-- undecodable payload, ...). Fenced like ack.
-- KEYS: the common header, then the block of the job's queue (a guess; see 'need').
-- ARGV: n, queue names; now ('' = the store's clock), id, token, error members (JSON text of
--   "kind", "type", "message", "traceback", without braces)
-- Returns {'ok'}, {'lost'} or {'need', queue...} (its queue, or its waiting children's); the
-- last two change nothing.
local now = clock(arg(1))
local id, token = arg(2), arg(3)
local key = P_JOB .. id
local qn, ck, _, _, kids = fenced(key, token, now)
if not qn then return {'lost'} end
local q = Q[qn]
if not q then return {'need', qn} end
local plan, need = children_plan(id, kids, 'dead')
if need then return {'need', unpack(need)} end
local f = redis.call('HMGET', key, 'attempt', 'worker_id')
add_error(id, f[1], now, f[2], arg(4))
leave(q, id, 'running', nil, ck)
redis.call('HDEL', key, 'lease_token', 'lease_expires_at')
redis.call('HSET', key, 'finished_at', num(now), 'last_token', token, 'last_outcome', 'dead')
enter(q, id, key, 'dead', now)
free_unique(key, id)
if plan then apply_children(plan, now) end
return {'ok'}
