-- _core.lua: what every script starts with, _common.lua's prelude and enqueue_one alike
-- (scripts.py prepends it at load): time, number and member encodings, the wake-up, and the
-- inbox fold.

-- Markers kept per wake list: enough to wake several idle workers for a burst, few enough
-- that leftovers cause only a handful of spurious wake-ups.
local WAKE_MAX = 8

-- The store's clock unless the caller injected a time (tests do).
local function clock(s)
  if s ~= nil and s ~= '' then return tonumber(s) end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

-- A new job's id, from the app's counter (P:ids). A partition of a partitioned app (hash tag
-- {prefix#p}: partitions.py) makes n * ID_STRIDE + p, so an id says where its job is; a plain
-- app makes 1, 2, 3...
local function new_id(ids_key)
  local n = redis.call('INCR', ids_key)
  local p = string.match(ids_key, '^{[^}]*#(%d+)}')
  if p then return string.format('%d', n * ID_STRIDE + tonumber(p)) end
  return tostring(n)
end

-- count new ids at once, for a batch: one INCRBY, not an INCR per job. Returns a function that
-- gives the k-th (k from 1, in the order new_id would have made them) as text and as a number.
local function new_ids(ids_key, count)
  local first = redis.call('INCRBY', ids_key, count) - count
  local p = string.match(ids_key, '^{[^}]*#(%d+)}')
  local stride, off = 1, 0
  if p then stride, off = ID_STRIDE, tonumber(p) end
  return function(k)
    local x = (first + k) * stride + off
    return string.format('%d', x), x
  end
end

-- Lua's own number-to-string keeps 14 digits, which would shift times by up to 0.1 ms;
-- 17 significant digits give back the very same double in Python.
local function num(x) return string.format('%.17g', x) end

-- Until when claim's hold (see claim.lua) on the queue whose fair hash is ``fair`` stands, or
-- nil when it does not at now: it has run out, or one of the full concurrency keys it names
-- ('holdc': key, running count...; under the prefix ``conc``) has freed a slot since, which a
-- job of another queue sharing the key may have done.
local function hold_until(fair, conc, now)
  local f = redis.call('HMGET', fair, 'hold', 'holdc')
  local t = tonumber(f[1] or 0)
  if t <= now then return nil end
  if f[2] then
    local c = cjson.decode(f[2])
    for i = 1, #c, 2 do
      if redis.call('ZCARD', conc .. c[i]) < c[i + 1] then return nil end
    end
  end
  return t
end

-- Claim order inside one queue is (priority, fair_tag, run_at, id). The ZSET score holds the
-- priority (a small integer, exact), and equal scores sort by member bytes, so the member is
-- the fair tag zero-padded to 16 digits, then a fixed-width, byte-sortable image of the exact
-- double run_at, then the zero-padded id. A composite float score (priority * 1e13 +
-- run_at_ms) would need more than the 53 bits a double holds and would also round run_at to a
-- millisecond. Tags and ids are integers below 2^53 (one per job ever enqueued), so 16 digits
-- hold them. The id is always the last 16 bytes, so id_of also reads members written before
-- tags existed (21 + 16 bytes, no tag: tag_of gives 0).
local TWO53 = 9007199254740992
local MEMBER_TAIL = 37  -- sortable(run_at) (21) .. id (16)
-- member_head: all of the member but the id, the same for every job of a batch that shares
-- the tag and run_at (the enqueue script makes it once for them).
local function member_head(tag, run_at)
  local code
  if run_at > 0 then
    local m, e = math.frexp(run_at)
    code = string.format('2%04d%016.0f', e + 1100, m * TWO53)
  elseif run_at < 0 then
    local m, e = math.frexp(-run_at)
    code = string.format('0%04d%016.0f', 1900 - e, TWO53 - 1 - m * TWO53)
  else
    code = '100000000000000000000'
  end
  return string.format('%016.0f', tag) .. code
end
local function member(tag, run_at, id)
  return member_head(tag, run_at) .. string.format('%016.0f', tonumber(id))
end
local function id_of(m) return tostring(tonumber(string.sub(m, -16))) end
local function tag_of(m)
  if #m <= MEMBER_TAIL then return 0 end
  return tonumber(string.sub(m, 1, #m - MEMBER_TAIL))
end

-- pkey writes a priority the same way whether it comes from ARGV, a job hash or a ZSET score
-- (+ 0 turns a -0 into 0): the 'v:<priority>' fields of fair sharing (see fair_tags).
local function pkey(p) return string.format('%.0f', tonumber(p) + 0) end

local function wake(q, n)
  if n <= 0 then return end
  local marks = {}
  for i = 1, math.min(n, WAKE_MAX) do marks[i] = '1' end
  -- LPUSH answers the new length: the trim is needed only past the cap (one call less on
  -- every enqueue while workers keep up).
  if redis.call('LPUSH', q.wake, unpack(marks)) > WAKE_MAX then
    redis.call('LTRIM', q.wake, 0, WAKE_MAX - 1)
  end
  -- The same wake-up on the shard channel named as the list, for the idle waits a
  -- partitioned app groups per node (wakes.py): a list's keys cannot span slots, a node's
  -- subscriptions can. With no subscriber it costs a lookup. pcall: an ACL user without
  -- channel rights (Redis 7's default for a new user) cannot publish, and its waits use the
  -- lists alone; its writes must not fail for that.
  redis.pcall('SPUBLISH', q.wake, n)
end


-- Variadic commands in slices, so a long argument list never overflows Lua's C stack.
local SLICE = 1000
local function call_many(cmd, key, args)
  for s = 1, #args, SLICE do
    redis.call(cmd, key, unpack(args, s, math.min(s + SLICE - 1, #args)))
  end
end

-- The inbox (P:q:<queue>:inbox) holds plain jobs enqueue_one wrote whole (hash, fair tag,
-- member) but did not yet put in their indexes: five ZADDs into large sets were most of that
-- script's time, and one by one each enqueue is a round trip the caller waits on. Every other
-- script given a queue's block folds its inbox first (_common.lua's prelude), so no script
-- ever reads that queue's indexes with jobs missing from them, and the order is kept: the
-- inbox is folded before anything else can change the queue (a claim raising a round's
-- virtual time, an enqueue with options), so the tags and members enqueue_one wrote are the
-- ones an immediate write would have made. enqueue_one folds too when the inbox reaches
-- FOLD_AT, which bounds the work any one script does here.
-- An entry is 'priority run_at member' (the member ends in the id, see id_of).
local FOLD_AT = 256
local function fold_inbox(inbox, all, state_available, jobs, available, due, fair)
  local items = redis.call('LRANGE', inbox, 0, -1)
  if #items == 0 then return end
  redis.call('DEL', inbox)
  redis.call('HDEL', fair, 'hold')  -- a new job may run: the queue is not held back (see claim)
  local ids, members, dues = {}, {}, {}
  for i, item in ipairs(items) do
    local p, t, m = string.match(item, '^(%S+) (%S+) (%S+)$')
    local id = id_of(m)
    ids[2 * i - 1], ids[2 * i] = id, id
    members[2 * i - 1], members[2 * i] = p, m
    dues[2 * i - 1], dues[2 * i] = t, id
  end
  call_many('ZADD', all, ids)
  call_many('ZADD', state_available, ids)
  call_many('ZADD', jobs, ids)
  call_many('ZADD', available, members)
  call_many('ZADD', due, dues)
end
