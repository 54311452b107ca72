-- cancel_many: cancel.lua for many jobs in one script (a bulk cancel's batch): each unfinished
-- job becomes cancelled as cancel.lua does it; finished or missing ids are skipped.
-- KEYS: the common header, then the blocks of the jobs' queues (a guess; see 'need').
-- ARGV: n, queue names; now ('' = the store's clock), then the job ids (ascending)
-- First every job and every cascade is read, and nothing is written unless the blocks of all
-- the queues they touch were given. Then the jobs are all cancelled, and only then are their
-- waiting children settled (_deps.lua): a child named in the call is cancelled by the call.
-- Returns {'ok', id...} (the ids cancelled, in ARGV order) or {'need', queue...} (the queues
-- of jobs or children whose blocks were not given; nothing changed).
local now = clock(arg(1))
local jobs, seen, need, missing = {}, {}, {}, {}
local function want(name)
  if not Q[name] and not missing[name] then
    missing[name] = true
    need[#need + 1] = name
  end
end
for k = A + 1, #ARGV do
  local id = ARGV[k]
  if not seen[id] then
    seen[id] = true
    local f = redis.call('HMGET', P_JOB .. id, 'state', 'queue', 'm', 'concurrency_key',
      'rate_key', 'kids')
    if is_unfinished(f[1]) then
      want(f[2])
      jobs[#jobs + 1] = {id, f}
      local _, more = children_plan(id, f[6], 'cancelled')
      for _, name in ipairs(more or {}) do want(name) end
    end
  end
end
if #need > 0 then return {'need', unpack(need)} end

local done = {'ok'}
for _, j in ipairs(jobs) do
  local id, f = j[1], j[2]
  local key = P_JOB .. id
  local q = Q[f[2]]
  leave(q, id, f[1], f[3], f[4], f[5])
  redis.call('HDEL', key, 'lease_token', 'lease_expires_at', 'm', 'pending')
  redis.call('HSET', key, 'finished_at', num(now))
  enter(q, id, key, 'cancelled', now)
  free_unique(key, id)
  done[#done + 1] = id
end
-- Children only ever leave 'waiting', so each cascade now reaches no more than it did when it
-- was read above: its queues' blocks are all here.
for _, j in ipairs(jobs) do
  local plan, more = children_plan(j[1], j[2][6], 'cancelled')
  if more then error('cancel_many: a cascade reached a queue it did not read') end
  if plan then apply_children(plan, now) end
end
return done
