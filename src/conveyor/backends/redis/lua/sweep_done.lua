-- sweep_done: copy the queues' own finished sets (succeeded, dead, cancelled) into
-- P:done:<state>, where prune looks. A store written before those existed has its finished
-- jobs only per queue: the client walks every queue once, in calls of a few hundred queues,
-- when the store is not yet marked P:indexed:done, keeping a cursor per queue and state. Each
-- call copies at most limit entries per queue and state, oldest first, and the entries that
-- share the finished_at of the last one (so a cursor on the score always moves). A score
-- cursor, not a rank: jobs deleted meanwhile shift no entry past it. (Each prune also sweeps
-- the due entries of a slice of queues: see prune.lua.) Idempotent.
-- KEYS: the common header, then the blocks of the queues to sweep.
-- ARGV: n, queue names; limit, then per queue three cursors, one per state in the order
--   succeeded, dead, cancelled: the lowest finished_at still to copy ('-inf' at first; '(x'
--   after x), or '' when that set is done.
-- Returns {'ok', {the next cursors, in the same order}}.
local FINISHED = {'succeeded', 'dead', 'cancelled'}
local limit = tonumber(arg(1))
local out = {}
for i, qn in ipairs(QNAMES) do
  local q = Q[qn]
  for j, state in ipairs(FINISHED) do
    local from = arg(1 + 3 * (i - 1) + j)
    local nxt = ''
    if from ~= '' then
      local r = redis.call('ZRANGEBYSCORE', q[state], from, '+inf', 'WITHSCORES', 'LIMIT', 0,
        limit)
      if #r / 2 == limit then
        local last = r[#r]
        local ties = redis.call('ZRANGEBYSCORE', q[state], last, last, 'WITHSCORES')
        for k = 1, #ties do r[#r + 1] = ties[k] end
        nxt = '(' .. last
      end
      local args = {}
      for k = 1, #r, 2 do
        args[#args + 1] = r[k + 1]
        args[#args + 1] = gmember(q, r[k])
      end
      if #args > 0 then call_many('ZADD', K_GLOBAL[state], args) end
    end
    out[#out + 1] = nxt
  end
end
return {'ok', out}
