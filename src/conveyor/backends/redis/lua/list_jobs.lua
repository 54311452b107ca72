-- list_jobs: jobs newest first (descending id) matching the filters, from the smaller of the
-- candidate indexes, with a bounded amount of work per call. It writes only what the prelude
-- does: the inboxes of the queues given, folded into their indexes.
-- KEYS: the common header, then the block of the queue filtered on, or of every queue.
-- ARGV: n, queue names; cursor (exclusive upper id bound, '' = from the newest), limit, budget
--   (ids to look at, at most), state, queue, task filters ('' = any)
-- Returns {{id, HGETALL, errors}... (up to limit), next cursor or ''}, or {'stale'} (no queue
-- filter, and not every queue's block given). The cursor is the last job
-- returned when more match, or the last id looked at when the budget ran out first.
local fs, fq, ft = arg(4), arg(5), arg(6)
if fq == '' and not queues_complete() then return {'stale'} end
-- Every index here is a ZSET of ids scored by id (P:jobs, P:state:<state>, P:q:<queue>:jobs).
local idx = K_ALL
if fq ~= '' then idx = Q[fq].jobs end
if fs ~= '' and (fq == '' or redis.call('ZCARD', K_STATE[fs]) < redis.call('ZCARD', idx)) then
  idx = K_STATE[fs]
end
local upper = '+inf'
if arg(1) ~= '' then upper = '(' .. arg(1) end
local limit, budget = tonumber(arg(2)), tonumber(arg(3))
local found, looked, last = {}, 0, nil
local exhausted = false
while #found <= limit and looked < budget do
  local batch = math.min(budget - looked, 500)
  local ids = redis.call('ZREVRANGEBYSCORE', idx, upper, '-inf', 'LIMIT', 0, batch)
  for _, id in ipairs(ids) do
    looked = looked + 1
    last = id
    local f = redis.call('HMGET', P_JOB .. id, 'state', 'queue', 'task')
    if f[1] and (fs == '' or f[1] == fs) and (fq == '' or f[2] == fq)
        and (ft == '' or f[3] == ft) then
      found[#found + 1] = id
      if #found > limit then break end
    end
  end
  if #ids < batch then exhausted = true break end
  upper = '(' .. last
end
local out = {}
for k = 1, math.min(limit, #found) do out[k] = job_data(found[k]) end
local cursor = ''
if #found > limit then
  cursor = found[limit]
elseif not exhausted and looked >= budget and last then
  cursor = last
end
return {out, cursor}
