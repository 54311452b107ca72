-- sweep: copy the expired leases and the due scheduled jobs of the given queues' own ZSETs into
-- P:leases and P:schedule, where reap and promote look. A store written before those global
-- indexes existed has them only per queue (and so do jobs claimed or scheduled by a worker of
-- that version still running during an upgrade): the client sweeps every queue once when the
-- store is not yet marked as indexed, then a few queues per reap, round the queue set, so a
-- straggler is found within one round. Only what is due is copied (reap and promote check
-- each job again), at most limit per queue and set. Idempotent.
-- KEYS: the common header, then the blocks of the queues to sweep.
-- ARGV: n, queue names; now ('' = the store's clock), limit
-- Returns {'ok', entries copied}.
local now = clock(arg(1))
local limit = tonumber(arg(2))
local copied = 0
local function copy(src, dst, q, max)
  local r = redis.call('ZRANGEBYSCORE', src, '-inf', max, 'WITHSCORES', 'LIMIT', 0, limit)
  local args = {}
  for k = 1, #r, 2 do
    args[#args + 1] = r[k + 1]
    args[#args + 1] = gmember(q, r[k])
  end
  if #args > 0 then
    call_many('ZADD', dst, args)
    copied = copied + #args / 2
  end
end
for _, qn in ipairs(QNAMES) do
  local q = Q[qn]
  copy(q.running, K_LEASES, q, '(' .. num(now))
  copy(q.scheduled, K_SCHEDULE, q, num(now))
end
return {'ok', copied}
