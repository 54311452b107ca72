-- ack: the job succeeded; store its result. Fenced: the token must be the current lease and
-- the lease unexpired at now. Frees the job's unique key unless it has a unique_for.
-- KEYS: the common header, then the block of the job's queue (a guess; see 'need').
-- ARGV: n, queue names; now ('' = the store's clock), id, token, has_result ('1'/'0'), result
-- Returns {'ok'}, {'lost'} (nothing changed) or {'need', queue} (nothing changed).
local now = clock(arg(1))
local id, token = arg(2), arg(3)
local key = P_JOB .. id
local qn, ck = fenced(key, token, now)
if not qn then return {'lost'} end
local q = Q[qn]
if not q then return {'need', qn} end
leave(q, id, 'running', nil, ck)
redis.call('HDEL', key, 'lease_token', 'lease_expires_at')
if arg(4) == '1' then redis.call('HSET', key, 'result', arg(5)) end
-- last_token lets a client whose reply was lost tell "my ack landed" from "lease lost".
redis.call('HSET', key, 'finished_at', num(now), 'last_token', token, 'last_outcome', 'succeeded')
enter(q, id, key, 'succeeded', now)
-- With a unique_for the key stays taken: enqueue reads finished_at + unique_for, and prune or
-- purge gives the key back when they delete the job.
if not redis.call('HGET', key, 'unique_for') then free_unique(key, id) end
return {'ok'}
