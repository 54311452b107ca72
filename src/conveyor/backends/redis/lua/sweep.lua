-- sweep: copy the expired leases and the due scheduled jobs of the given queues' own ZSETs into
-- P:leases and P:schedule, where reap and promote look (sweep_queue in _common.lua). A store
-- written before those global indexes existed has them only per queue: the client sweeps every
-- queue once, in calls of a few hundred queues, when the store is not yet marked P:indexed.
-- (Each reap and promote also sweeps the queues it is given: see there.) Idempotent.
-- KEYS: the common header, then the blocks of the queues to sweep.
-- ARGV: n, queue names; now ('' = the store's clock), limit (per queue and set)
-- Returns {'ok', entries copied}.
local now = clock(arg(1))
local limit = tonumber(arg(2))
local copied = 0
for _, qn in ipairs(QNAMES) do
  copied = copied + sweep_queue(Q[qn], 'running', '(' .. num(now), limit)
  copied = copied + sweep_queue(Q[qn], 'scheduled', num(now), limit)
end
return {'ok', copied}
