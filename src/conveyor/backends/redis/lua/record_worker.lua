-- record_worker: insert or refresh a worker's entry (last_seen = now) and forget workers not
-- seen for a day.
-- KEYS: the common header (no queue blocks).
-- ARGV: 0; now ('' = the store's clock), worker id, info (JSON: queues, concurrency, host, pid,
--   started_at, running, stuck; a worker of an older version leaves stuck out)
-- Returns {'ok', now}.
local now = clock(arg(1))
redis.call('HSET', K_WORKERS, arg(2), arg(3))
redis.call('ZADD', K_SEEN, now, arg(2))
local gone = redis.call('ZRANGEBYSCORE', K_SEEN, '-inf', '(' .. num(now - 86400), 'LIMIT', 0, 1000)
for _, w in ipairs(gone) do
  redis.call('HDEL', K_WORKERS, w)
  redis.call('ZREM', K_SEEN, w)
end
return {'ok', num(now)}
