-- remove_worker: forget a worker (it stopped).
-- KEYS: the common header (no queue blocks).
-- ARGV: 0; worker id
-- Returns {'ok'}.
redis.call('HDEL', K_WORKERS, arg(1))
redis.call('ZREM', K_SEEN, arg(1))
return {'ok'}
