-- purge: delete finished jobs of one state (the client refuses unfinished states), with their
-- workflow keys (forget_links in _deps.lua).
-- KEYS: the common header, then the blocks of every queue in P:queues.
-- ARGV: n, queue names; state, queue filter ('' = every queue), mode, then
--   mode 'ids': the job ids (each deleted only if it is in state and the queue filter);
--   mode 'all': batch: deletes up to batch jobs.
-- Returns {'ok', deleted count, more (1 if mode 'all' may have more)} or {'stale'}.
if not queues_complete() then return {'stale'} end
local state, only, mode = arg(1), arg(2), arg(3)
local deleted = 0
local more = 0
if mode == 'ids' then
  for i = A + 3, #ARGV do
    local id = ARGV[i]
    local f = redis.call('HMGET', P_JOB .. id, 'state', 'queue')
    if f[1] == state and (only == '' or f[2] == only) then
      forget_links(id)
      delete_job(Q[f[2]], id, state)
      deleted = deleted + 1
    end
  end
else
  local left = tonumber(arg(4))
  for _, qn in ipairs(QNAMES) do
    if only == '' or qn == only then
      local ids = redis.call('ZRANGE', Q[qn][state], 0, left - 1)
      for _, id in ipairs(ids) do
        forget_links(id)
        delete_job(Q[qn], id, state)
      end
      deleted = deleted + #ids
      left = left - #ids
      if left <= 0 then more = 1 break end
    end
  end
end
return {'ok', deleted, more}
