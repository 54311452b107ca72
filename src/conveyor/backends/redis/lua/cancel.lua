-- cancel: an unfinished job becomes cancelled. A running job loses its lease, so its worker's
-- next heartbeat or ack is refused and the worker stops it.
-- KEYS: the common header, then the block of the job's queue (a guess; see 'need').
-- ARGV: n, queue names; now ('' = the store's clock), id
-- A waiting job is cancelled the same way; either way its waiting children are settled (see
-- _deps.lua).
-- Returns {'ok', 1} if cancelled, {'ok', 0} if missing or finished, or {'need', queue...} (its
-- queue, or its waiting children's; nothing changed).
local now = clock(arg(1))
local id = arg(2)
local key = P_JOB .. id
local f = redis.call('HMGET', key, 'state', 'queue', 'm', 'concurrency_key', 'rate_key', 'kids')
if not is_unfinished(f[1]) then return {'ok', 0} end
local q = Q[f[2]]
if not q then return {'need', f[2]} end
local plan, need = children_plan(id, f[6], 'cancelled')
if need then return {'need', unpack(need)} end
leave(q, id, f[1], f[3], f[4], f[5])
redis.call('HDEL', key, 'lease_token', 'lease_expires_at', 'm', 'pending')
redis.call('HSET', key, 'finished_at', num(now))
enter(q, id, key, 'cancelled', now)
free_unique(key, id)
if plan then apply_children(plan, now) end
return {'ok', 1}
