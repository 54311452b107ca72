-- outbox_sweep: Backend.outbox_sweep. The oldest marks of P:outbox made at or before
-- now - older_than: a mark whose job is available or scheduled is renewed at now and the id
-- returned (its message is to be published again); any other (the job running, finished,
-- waiting, or gone) is removed.
-- KEYS: the common header (no queue blocks).
-- ARGV: n (0); now ('' = the store's clock), older_than (seconds), limit.
-- Returns {the number of marks looked at, the ids whose marks were renewed in the marks'
-- order}: a batch of marks that all needed no message is told from the last one.
local now = clock(arg(1))
local t = num(now)
local marks = redis.call('ZRANGEBYSCORE', K.outbox, '-inf', num(now - tonumber(arg(2))),
  'LIMIT', 0, tonumber(arg(3)))
local due = {}
for _, id in ipairs(marks) do
  local st = redis.call('HGET', K.job .. id, 'state')
  if st == 'available' or st == 'scheduled' then
    redis.call('ZADD', K.outbox, t, id)
    due[#due + 1] = id
  else
    redis.call('ZREM', K.outbox, id)
  end
end
return {#marks, due}
