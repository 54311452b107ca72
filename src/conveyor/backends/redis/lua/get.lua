-- get: a job's hash and its error records, read together (one script: no write comes between
-- the two reads). A script rather than MULTI/EXEC, because at maxmemory Redis refuses every
-- command queued in a MULTI, reads too, and jobs must stay readable on a full Redis.
-- KEYS (named in K): job = P:job:<id>, errors = P:errors:<id>
-- ARGV: none
-- Returns {the hash as field, value pairs, the error records}.
return {redis.call('HGETALL', K.job), redis.call('LRANGE', K.errors, 0, -1)}
