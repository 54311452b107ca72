-- enqueue_one: the enqueue script's work for one plain job, written out: a job due now with no
-- unique key, depth limit, fair key, concurrency or rate limit, and no cron tick. Most
-- enqueues are that, and one by one each is a round trip the caller waits on: this script
-- takes 11 keys and 9 arguments instead of 29 and 33, skips the general script's batch
-- bookkeeping and the shared prelude (only _core.lua comes before it), writes the job whole
-- and leaves its index entries in the queue's inbox (fold_inbox in _core.lua), to be written
-- in bulk by the next script given the queue. Once folded, the store holds exactly what
-- enqueue.lua writes for such a job (tests/redis/test_enqueue_one.py compares the two).
-- KEYS: ENQUEUE_ONE_KEYS in keys.py, named in K: job, jobs, state:available, queues, ids,
--   then the queue's q:available, q:jobs, q:wake, q:fair, q:due and q:inbox (see _common.lua).
-- ARGV: now ('' = the store's clock), queue, task, args (JSON), priority, max_attempts,
--   timeout_s, meta (JSON), uid (made by the client: random, see Job.uid).
-- Returns {now, id, 1}, as enqueue.lua does for a batch of one.
local P_JOB, K_ALL, K_AVAILABLE = K.job, K.jobs, K['state:available']
local K_QUEUES, K_IDS = K.queues, K.ids
local Q_AVAILABLE, Q_JOBS, Q_WAKE = K['q:available'], K['q:jobs'], K['q:wake']
local Q_FAIR, Q_DUE, Q_INBOX = K['q:fair'], K['q:due'], K['q:inbox']
local now = clock(ARGV[1])
local qn, task, args, prio, maxa, timeout, meta, uid = unpack(ARGV, 2, 9)
local t = num(now)
-- Fair sharing: without a fair key a job is a round of its own, the round's virtual time + 1
-- (tags.take in _common.lua). Nothing raises that time while the inbox holds jobs: a claim
-- folds them first.
local tag = tonumber(redis.call('HGET', Q_FAIR, 'v:' .. pkey(prio)) or 0) + 1
local id = new_id(K_IDS)
local m = member(tag, now, id)
redis.call('HSET', P_JOB .. id, 'task', task, 'queue', qn, 'args', args, 'priority', prio,
  'run_at', t, 'attempt', 0, 'max_attempts', maxa, 'timeout_s', timeout, 'meta', meta,
  'created_at', t, 'uid', uid, 'fair_tag', string.format('%.0f', tag), 'state', 'available',
  'm', m)
local waiting = redis.call('RPUSH', Q_INBOX, prio .. ' ' .. t .. ' ' .. m)
-- The first job since the inbox was last folded names the queue in P:queues (a queue leaves it
-- only with an empty inbox), so a queue with an inbox is always there.
if waiting == 1 then redis.call('SADD', K_QUEUES, qn) end
-- Wake-up markers: one per job for the first WAKE_MAX since the last fold, as many as the list
-- keeps. Every worker checks before it blocks and after it pops a marker (a claim, which
-- folds, or look.lua, which counts an inbox as jobs waiting and so leads to a claim), so a
-- longer inbox means none of those markers has been acted on yet: one more would wake nobody
-- new.
if waiting <= WAKE_MAX then wake({wake = Q_WAKE}, 1) end
if waiting >= FOLD_AT then
  fold_inbox(Q_INBOX, K_ALL, K_AVAILABLE, Q_JOBS, Q_AVAILABLE, Q_DUE, Q_FAIR)
end
return {t, id, 1}
