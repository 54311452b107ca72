-- claim: lease up to `limit` jobs of one queue, lowest (priority, fair_tag, run_at, id) first,
-- after promoting the queue's scheduled jobs that are due, and raise the queue's virtual time
-- to the largest fair tag handed out. A claimed job stays in Redis (in the running ZSET, scored
-- by lease expiry) until it is finished, so a crash loses nothing.
-- KEYS: the common header, then the block of the queue.
-- ARGV: 1, queue; now ('' = the store's clock), limit, lease_s, worker_id, then `limit`
--   lease tokens made by the client (Lua's math.random is not a safe source of them).
-- Returns one {id, HGETALL, errors} per claimed job, in claim order.
local q = Q[QNAMES[1]]
local now = clock(arg(1))
local limit = tonumber(arg(2))
local expires = now + tonumber(arg(3))
local worker_id = arg(4)
promote_queue(q, now, 1000)
local popped = redis.call('ZPOPMIN', q.available, limit)
if #popped == 0 then return {} end
local out, ids, running, states = {}, {}, {}, {}
local top = -1
local n_at, e_at = num(now), num(expires)
for k = 1, #popped, 2 do
  local m = popped[k]
  local id = id_of(m)
  local tag = tag_of(m)
  if tag > top then top = tag end
  local key = P_JOB .. id
  redis.call('HINCRBY', key, 'attempt', 1)
  redis.call('HSET', key, 'state', 'running', 'attempted_at', n_at, 'worker_id', worker_id,
    'lease_token', arg(4 + (k + 1) / 2), 'lease_expires_at', e_at)
  redis.call('HDEL', key, 'm')
  ids[#ids + 1] = id
  running[#running + 1] = e_at
  running[#running + 1] = id
  states[#states + 1] = id
  states[#states + 1] = id
  out[#out + 1] = job_data(id)
end
call_many('ZREM', K_STATE.available, ids)
call_many('ZREM', q.due, ids)
call_many('ZADD', q.running, running)
call_many('ZADD', K_STATE.running, states)
local vtime = tonumber(redis.call('HGET', q.fair, 'vtime') or 0)
if top > vtime then redis.call('HSET', q.fair, 'vtime', string.format('%.0f', top)) end
return out
