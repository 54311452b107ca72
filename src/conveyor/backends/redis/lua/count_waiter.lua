-- count_waiter: job.wait's counts of waiters (see finish_watch in redis/backend.py and
-- tell_waiters in _common.lua). KEYS (named in K): waiters = P:wait:<id>, anywhere =
-- P:wait:any. ARGV: the change (+1 a waiter comes, -1 it goes, 0 renews the TTL), the TTL in
-- seconds. A count that falls to 0 is deleted, so while nobody waits the finishing scripts
-- find P:wait:any missing.
for _, key in ipairs({K.waiters, K.anywhere}) do
  local n = redis.call('INCRBY', key, ARGV[1])
  if n <= 0 then redis.call('DEL', key) else redis.call('EXPIRE', key, ARGV[2]) end
end
return 1
