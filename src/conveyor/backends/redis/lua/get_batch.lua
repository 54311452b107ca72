-- get_batch: a batch's record and its members counted by state (see _deps.lua). Reads only.
-- KEYS: the common header (no queue block).
-- ARGV: 0; batch id
-- Returns {} for an unknown batch, else {created_at, parent_id ('' = none), on_success ('' =
-- none), on_complete ('' = none), then state, count pairs}.
local bid = arg(1)
local f = redis.call('HMGET', P_BATCH .. bid, 'created_at', 'parent_id', 'on_success',
  'on_complete')
if not f[1] then return {} end
local counts = {}
for _, id in ipairs(redis.call('SMEMBERS', P_MEMBERS .. bid)) do
  local s = redis.call('HGET', P_JOB .. id, 'state')
  if s then counts[s] = (counts[s] or 0) + 1 end
end
local out = {f[1], f[2] or '', f[3] or '', f[4] or ''}
for s, n in pairs(counts) do
  out[#out + 1] = s
  out[#out + 1] = n
end
return out
