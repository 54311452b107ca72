-- claim: lease up to `limit` jobs of one queue, lowest (priority, run_at, id) first, after
-- promoting the queue's scheduled jobs that are due. A claimed job stays in Redis (in the
-- running ZSET, scored by lease expiry) until it is finished, so a crash loses nothing.
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
local out = {}
for k = 1, #popped, 2 do
  local id = id_of(popped[k])
  local key = P_JOB .. id
  redis.call('ZREM', K_STATE.available, id)
  redis.call('HINCRBY', key, 'attempt', 1)
  redis.call('HSET', key, 'state', 'running', 'attempted_at', num(now), 'worker_id', worker_id,
    'lease_token', arg(4 + (k + 1) / 2), 'lease_expires_at', num(expires))
  redis.call('HDEL', key, 'm')
  redis.call('ZADD', q.running, expires, id)
  redis.call('ZADD', K_STATE.running, id, id)
  out[#out + 1] = job_data(id)
end
return out
