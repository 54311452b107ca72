-- ack: the job succeeded; store its result (succeed() in _common.lua). Fenced: the token must
-- be the current lease and the lease unexpired at now.
-- KEYS: the common header, then the block of the job's queue (a guess; see 'need').
-- ARGV: n, queue names; now ('' = the store's clock), id, token, has_result ('1'/'0'), result
-- Returns {'ok'}, {'lost'} (nothing changed) or {'need', queue...} (nothing changed: the
-- job's queue, or its waiting children's, see _deps.lua).
local now = clock(arg(1))
local id, token = arg(2), arg(3)
local key = P_JOB .. id
local qn, ck, uk, ufor, kids = fenced(key, token, now)
if not qn then return {'lost'} end
local q = Q[qn]
if not q then return {'need', qn} end
local plan, need = children_plan(id, kids, 'succeeded')
if need then return {'need', unpack(need)} end
local w = index_writes()
succeed(q, id, key, token, ck, uk, ufor, now, arg(4), arg(5), w)
w.flush()
if plan then apply_children(plan, now) end
return {'ok'}
