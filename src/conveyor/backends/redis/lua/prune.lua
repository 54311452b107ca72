-- prune: delete up to limit finished jobs of the given states whose finished_at is more than
-- older_than seconds before now, oldest first within each state. Deleting a job deletes its
-- hash (with its step records), errors and index entries, and frees a unique key it held, and
-- its workflow keys (forget_links in _deps.lua). A job with a child not yet finished is kept
-- (the child may read its result); it is passed over, looking at up to as many again.
-- The due jobs are the head of P:done:<state> (all queues), so a call costs O(due + log n)
-- whatever the number of queues. The client reads those heads first and sends the blocks of
-- those jobs' queues, as reap does with P:leases; the script answers 'need' for one it missed.
-- An entry is checked against its queue's own set: one whose job is no longer there (deleted
-- or redriven by a client of the previous version) is dropped, one whose job finished later
-- is rescored; neither is counted.
-- The first nslice blocks are a slice of the queue set, which the client goes round a bounded
-- number of queues per call. Their own finished sets' oldest due entries (limit / nslice per
-- queue and state: most of them are in the index already) are copied into P:done:<state> first
-- (sweep_queue), so a job finished by a worker of the previous version is found. Then one
-- HSCAN step of up to limit fields of each one's P:q:<queue>:fair drops the last tags
-- 't:<priority>:<fair key>' at or below the vtime 'v:<priority>' of their round (they mean
-- nothing any more), and the fields of the layout before rounds were per priority ('vtime',
-- 'k:<fair key>'); the cursor is kept in the hash's 'scan' field, so successive rounds walk
-- the whole hash.
-- KEYS: the common header, then the blocks of the slice, then those of the due jobs' queues.
-- ARGV: n, queue names; now ('' = the store's clock), older_than, limit, nslice, then states
--   (each one of succeeded, dead, cancelled: the client refuses the others)
-- Returns {'ok', count} or {'need', queue...} (nothing deleted).
local now = clock(arg(1))
local cutoff = now - tonumber(arg(2))
local before = '(' .. num(cutoff)
local limit = tonumber(arg(3))
local nslice = tonumber(arg(4))
local per_queue = math.max(1, math.floor(limit / math.max(nslice, 1)))
local heads, need, asked = {}, {}, {}
for s = A + 4, #ARGV do
  local state = ARGV[s]
  for i = 1, nslice do sweep_queue(Q[QNAMES[i]], state, before, per_queue) end
  local _, found, missing = due_entries(K_GLOBAL[state], before, 2 * limit)
  heads[#heads + 1] = {state, found}
  for _, qn in ipairs(missing) do
    if not asked[qn] then
      asked[qn] = true
      need[#need + 1] = qn
    end
  end
end
if #need > 0 then return {'need', unpack(need)} end
local left = limit
local deleted = 0
for _, head in ipairs(heads) do
  local state, found = head[1], head[2]
  local index = K_GLOBAL[state]
  for k = 1, #found do
    if left <= 0 then break end
    local id, q, m = found[k][1], found[k][2], found[k][3]
    local at = redis.call('ZSCORE', q[state], id)
    if not at then
      redis.call('ZREM', index, m)
    elseif tonumber(at) >= cutoff then
      redis.call('ZADD', index, at, m)
    elseif not has_unfinished_kid(id) then
      forget_links(id)
      delete_job(q, id, state)
      deleted = deleted + 1
      left = left - 1
    end
  end
end
local budget = math.max(limit, 1)
for i = 1, nslice do
  local fair = Q[QNAMES[i]].fair
  local cursor = redis.call('HGET', fair, 'scan') or '0'
  local r = redis.call('HSCAN', fair, cursor, 'COUNT', budget)
  local vt, drop = {}, {}
  for k = 1, #r[2], 2 do
    local f = r[2][k]
    local p = string.match(f, '^t:(%-?%d+):')
    if p then
      local v = vt[p]
      if v == nil then
        v = tonumber(redis.call('HGET', fair, 'v:' .. p) or 0)
        vt[p] = v
      end
      if tonumber(r[2][k + 1]) <= v then drop[#drop + 1] = f end
    elseif f == 'vtime' or string.sub(f, 1, 2) == 'k:' then
      drop[#drop + 1] = f
    end
  end
  call_many('HDEL', fair, drop)
  if r[1] ~= '0' then
    redis.call('HSET', fair, 'scan', r[1])
  elseif cursor ~= '0' then
    redis.call('HDEL', fair, 'scan')
  end
end
return {'ok', deleted}
