-- cron_control: disable or enable a cron schedule (Backend.set_cron_enabled).
-- ARGV: n = 0 queues; now ('' = the store's clock), schedule name, '1' to enable or '0' to
-- disable. Returns 1 if it changed the schedule, 0 if it was so already. Disabling a schedule
-- no scheduler has seen records now as its last tick, as a first sight would.
local now = clock(arg(1))
local name = arg(2)
local disabled = redis.call('HEXISTS', K.cron_off, name) == 1
if arg(3) == '1' then
  if not disabled then return 0 end
  redis.call('HDEL', K.cron_off, name)
  redis.call('HSET', K.cron_on, name, num(now))
  return 1
end
if disabled then return 0 end
redis.call('HSET', K.cron_off, name, num(now))
redis.call('HSETNX', K_CRON, name, num(now))
return 1
