-- take: lease job `id` for a delivery a message broker made (Backend.take): the store is then a
-- broker's companion, which keeps the job records while the broker decides who runs what, and
-- when. Whatever its run_at (the broker held the delay) and whatever lease it held, the job
-- becomes running as a claim makes it: attempt + 1, the caller's token and worker, attempted_at
-- = now, lease_expires_at = now + lease_s, 'm' and 'held' gone (it starts at once). It leaves
-- available (its member, its due entry, the queue's 'gated' count) or scheduled (P:schedule
-- too) through leave(), and enters the queue's running set, P:leases and P:state:running, with
-- P:conc:<key> and P:rate:<key> written as a claim writes them, and its priority's round of
-- fair sharing ('v:<priority>') raised to its tag as a claim raises it: so a store that both
-- claims and takes keeps one set of rules. Limits and the queue's pause are not checked: the
-- companion refuses jobs that have them.
-- A running job's lease was lost (the broker handed the message out again because its holder
-- stopped answering): the lost attempt is recorded as a lease_expired error naming the old
-- worker and counted in P:expiries, as reap records an expiry, and the new expiry replaces the
-- old one in every index; the old holder's token no longer matches, so it is fenced. If that
-- was its last attempt (attempt >= max_attempts), the job goes dead instead, as reap makes it
-- (the error says no attempts were left; unique key freed, children settled, waiters told)
-- and is not taken. The same token again is the same delivery (the call sent again after its
-- reply was lost): the job comes back as it is, so the client may repeat a take. A live lease
-- whose token ends with 'message' (when given) is not taken over: its holder runs a delivery of
-- this very message (the broker handed it to two receivers at once; Backend.take).
-- KEYS: the common header, then the block of the job's queue (a guess; see 'need'), and of its
-- waiting children's queues when it goes dead.
-- ARGV: n, queue names; now ('' = the store's clock), id, token, worker_id, lease_s, message
-- ('' = none)
-- Returns {} when the job is not taken: nothing changed (no such job; waiting; finished; held
-- for this message), or it
-- went dead (spent); {'need', queue...} (nothing changed) when a queue block is missing: its
-- queue's, or its waiting children's when it goes dead (see _deps.lua); else {'ok', id, its
-- hash as field, value pairs (step records included), its error records} (job_data).
local now = clock(arg(1))
local id, token, worker_id, message = arg(2), arg(3), arg(4), arg(6)
local expires = now + tonumber(arg(5))
local key = P_JOB .. id
local f = redis.call('HMGET', key, 'state', 'queue', 'lease_token', 'm', 'concurrency_key',
  'rate_key', 'rate_period', 'attempt', 'worker_id', 'priority', 'fair_tag', 'max_attempts',
  'kids', 'lease_expires_at')
local state = f[1]
if state ~= 'available' and state ~= 'scheduled' and state ~= 'running' then return {} end
if state == 'running' and f[3] == token then return {'ok', unpack(job_data(id))} end
if state == 'running' and message ~= '' and f[3] and tonumber(f[14] or 0) > now
    and string.sub(f[3], -#message) == message then
  return {}
end
local q = Q[f[2]]
if not q then return {'need', f[2]} end
local ck, rk = f[5], f[6]
local spent = state == 'running' and tonumber(f[8]) >= tonumber(f[12])
-- A job that goes dead with unsettled children needs their queues' blocks before anything is
-- written (plan_children asks for them).
local plan = nil
if spent then
  local need
  plan, need = children_plan(id, f[13], 'dead')
  if need then return {'need', unpack(need)} end
end
local n_at, e_at = num(now), num(expires)
if state == 'running' then
  local why = 'the broker handed the job out again: worker ' .. (f[9] or '?')
    .. ' stopped answering'
  if spent then why = why .. '; no attempts left' end
  add_error(id, f[8], now, f[9], '"kind":"lease_expired","type":"LeaseExpired","message":'
    .. cjson.encode(why) .. ',"traceback":""')
  redis.call('HINCRBY', K_EXPIRIES, q.name, 1)
  if spent then  -- as reap makes a job dead: the holder's worker_id and attempt stay
    leave(q, id, 'running', nil, ck)
    redis.call('HDEL', key, 'lease_token', 'lease_expires_at', 'held')
    redis.call('HSET', key, 'finished_at', n_at)
    enter(q, id, key, 'dead', now)
    free_unique(key, id)
    if plan then apply_children(plan, now) end
    return {}
  end
else
  leave(q, id, state, f[4], ck, rk)
  redis.call('ZADD', K_STATE.running, id, id)
  local vf, tag = 'v:' .. pkey(f[10]), tonumber(f[11] or 0)
  if tag > tonumber(redis.call('HGET', q.fair, vf) or 0) then
    redis.call('HSET', q.fair, vf, string.format('%.0f', tag))
  end
end
-- ZADD rescores a running job's entries: one member per job in each.
redis.call('ZADD', q.running, e_at, id)
redis.call('ZADD', K_LEASES, e_at, gmember(q, id))
if ck then redis.call('ZADD', P_CONC .. ck, e_at, id) end
if rk then
  -- A claim of the key, as claim.lua records one: closed windows dropped first (a claim drops
  -- them when it counts), and the key lives as long as its last open window.
  local k = P_RATE .. rk
  redis.call('ZREMRANGEBYSCORE', k, '-inf', n_at)
  redis.call('ZADD', k, num(now + tonumber(f[7])), id .. ':' .. token)
  local last = redis.call('ZRANGE', k, -1, -1, 'WITHSCORES')
  local ms = math.min(math.max(math.ceil((tonumber(last[2]) - now) * 1000), 0) + 1, 1e15)
  redis.call('PEXPIRE', k, string.format('%.0f', ms))
end
redis.call('HSET', key, 'state', 'running', 'attempted_at', n_at, 'worker_id', worker_id,
  'lease_token', token, 'lease_expires_at', e_at, 'attempt',
  string.format('%d', tonumber(f[8] or 0) + 1))
redis.call('HDEL', key, 'm', 'held')
return {'ok', unpack(job_data(id))}
