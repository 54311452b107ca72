-- lock: take (ARGV[3] = '1') or renew a store-wide lock (see try_lock in redis/core.py). The key
-- holds the holder's token and expires after ttl ms unless renewed. Safe to send twice: a
-- retried take whose first reply was lost finds its own token and renews.
-- KEYS (named in K): lock = the lock's key. ARGV: token, ttl in ms, take ('1') or renew only ('0').
-- Returns 1 if the caller holds the lock now, else 0.
local held = redis.call('GET', K.lock)
if held == ARGV[1] then
  redis.call('PEXPIRE', K.lock, ARGV[2])
  return 1
end
if held or ARGV[3] ~= '1' then return 0 end
redis.call('SET', K.lock, ARGV[1], 'PX', ARGV[2])
return 1
