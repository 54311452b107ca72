-- enqueue_one: the enqueue script's work for one plain job, written out: a job due now with no
-- unique key, depth limit, fair key, concurrency or rate limit, and no cron tick. Most
-- enqueues are that, and one by one each is a round trip the caller waits on: this script
-- takes 10 keys and 8 arguments instead of 28 and 25, skips the general script's batch
-- bookkeeping and the shared prelude (only _core.lua comes before it), and writes exactly
-- what enqueue.lua writes for such a job (tests/redis/test_enqueue_one.py compares the two).
-- KEYS: P:job:, P:jobs, P:state:available, P:queues, P:ids, then the queue's available, jobs,
--   wake, fair and due keys (see _common.lua for each).
-- ARGV: now ('' = the store's clock), queue, task, args (JSON), priority, max_attempts,
--   timeout_s, meta (JSON).
-- Returns {now, id, 1}, as enqueue.lua does for a batch of one.
local P_JOB, K_ALL, K_AVAILABLE, K_QUEUES, K_IDS = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local Q_AVAILABLE, Q_JOBS, Q_WAKE, Q_FAIR, Q_DUE = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local now = clock(ARGV[1])
local qn, task, args, prio, maxa, timeout, meta = unpack(ARGV, 2, 8)
local t = num(now)
-- Fair sharing: without a fair key a job is a round of its own, the round's virtual time + 1
-- (tags.take in _common.lua).
local tag = tonumber(redis.call('HGET', Q_FAIR, 'v:' .. pkey(prio)) or 0) + 1
local id = tostring(redis.call('INCR', K_IDS))
local m = member(tag, now, id)
redis.call('HSET', P_JOB .. id, 'task', task, 'queue', qn, 'args', args, 'priority', prio, 'run_at', t,
  'attempt', 0, 'max_attempts', maxa, 'timeout_s', timeout, 'meta', meta, 'created_at', t,
  'fair_tag', string.format('%.0f', tag), 'state', 'available', 'm', m)
redis.call('ZADD', K_ALL, id, id)
redis.call('SADD', K_QUEUES, qn)
redis.call('ZADD', K_AVAILABLE, id, id)
redis.call('ZADD', Q_JOBS, id, id)
redis.call('ZADD', Q_AVAILABLE, prio, m)
redis.call('ZADD', Q_DUE, t, id)
wake({wake = Q_WAKE}, 1)
return {t, id, 1}
