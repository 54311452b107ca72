-- prune: delete up to limit finished jobs of the given states whose finished_at is more than
-- older_than seconds before now, oldest first within each state. Deleting a job deletes its
-- hash (with its step records), errors and index entries, and frees a unique key it held, and
-- its workflow keys (forget_links in _deps.lua). A job with a child not yet finished is kept
-- (the child may read its result); it is passed over, looking at up to as many again.
-- Then, per queue, one HSCAN step of up to limit fields of P:q:<queue>:fair drops the last tags
-- 't:<priority>:<fair key>' at or below the vtime 'v:<priority>' of their round (they mean
-- nothing any more), and the fields of the layout before rounds were per priority ('vtime',
-- 'k:<fair key>'); the cursor is kept in the hash's 'scan' field, so successive prunes walk
-- the whole hash.
-- KEYS: the common header, then the blocks of every queue in P:queues.
-- ARGV: n, queue names; now ('' = the store's clock), older_than, limit, then states (each one
--   of succeeded, dead, cancelled: the client refuses the others)
-- Returns {'ok', count} or {'stale'} (nothing changed).
if not queues_complete() then return {'stale'} end
local now = clock(arg(1))
local before = '(' .. num(now - tonumber(arg(2)))
local left = tonumber(arg(3))
local deleted = 0
for s = A + 3, #ARGV do
  if left <= 0 then break end
  local state = ARGV[s]
  local found = {}
  for _, qn in ipairs(QNAMES) do
    local r = redis.call('ZRANGEBYSCORE', Q[qn][state], '-inf', before, 'WITHSCORES',
      'LIMIT', 0, 2 * left)
    for k = 1, #r, 2 do found[#found + 1] = {r[k], tonumber(r[k + 1]), Q[qn]} end
  end
  table.sort(found, function(a, b) return a[2] < b[2] end)
  local gone = 0
  for k = 1, #found do
    if gone >= left then break end
    local id = found[k][1]
    if not has_unfinished_kid(id) then
      forget_links(id)
      delete_job(found[k][3], id, state)
      gone = gone + 1
    end
  end
  deleted = deleted + gone
  left = left - gone
end
local budget = math.max(tonumber(arg(3)), 1)
for _, qn in ipairs(QNAMES) do
  local fair = Q[qn].fair
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
