-- queue_pause: pause or resume one queue (backends/base.py, "Pausing a queue").
-- KEYS: the common header, then the block of the queue.
-- ARGV: 1, queue; now ('' = the store's clock), 'pause' or 'resume'
-- Returns 1 if this changed the queue, else 0. A pause keeps the time of the first one; a
-- resume pushes wake-up markers, as an enqueue does, so idle workers of the queue claim now
-- rather than at their next poll.
local qn = QNAMES[1]
if arg(2) == 'pause' then
  return redis.call('HSETNX', K.paused, qn, num(clock(arg(1))))
end
local changed = redis.call('HDEL', K.paused, qn)
if changed == 1 then wake(Q[qn], WAKE_MAX) end
return changed
