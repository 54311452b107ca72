-- list_jobs (read-only): jobs newest first (descending id) matching the filters, from the
-- smaller of the candidate indexes given, with a bounded amount of work per call.
-- KEYS: the common header (no queue blocks), then 1 or 2 index ZSETs of ids scored by id
--   (P:jobs, P:state:<state>, P:q:<queue>:jobs).
-- ARGV: 0; nindex, cursor (exclusive upper id bound, '' = from the newest), limit, budget
--   (ids to look at, at most), state, queue, task filters ('' = any)
-- Returns {{id, HGETALL, errors}... (up to limit), next cursor or ''}. The cursor is the last
-- job returned when more match, or the last id looked at when the budget ran out first.
local idx = xkey(1)
if tonumber(arg(1)) == 2 and redis.call('ZCARD', xkey(2)) < redis.call('ZCARD', idx) then idx = xkey(2) end
local upper = '+inf'
if arg(2) ~= '' then upper = '(' .. arg(2) end
local limit, budget = tonumber(arg(3)), tonumber(arg(4))
local fs, fq, ft = arg(5), arg(6), arg(7)
local found, looked, last = {}, 0, nil
local exhausted = false
while #found <= limit and looked < budget do
  local batch = math.min(budget - looked, 500)
  local ids = redis.call('ZREVRANGEBYSCORE', idx, upper, '-inf', 'LIMIT', 0, batch)
  for _, id in ipairs(ids) do
    looked = looked + 1
    last = id
    local f = redis.call('HMGET', P_JOB .. id, 'state', 'queue', 'task')
    if f[1] and (fs == '' or f[1] == fs) and (fq == '' or f[2] == fq) and (ft == '' or f[3] == ft) then
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
