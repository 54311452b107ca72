-- record_step: record that a step of a job finished with a result, unless a record of that
-- step exists already (the first record wins). Not fenced: any attempt that did the step may
-- record it. The record is a field 'step:<name>' of the job's hash, so it lives and dies with
-- the job (prune and purge delete it with the hash).
-- KEYS: the common header (no queue blocks).
-- ARGV: 0; id, step name (checked by the client; the 'step:' prefix keeps it apart from the
--   job's own fields, none of which contains ':'), result (JSON text; 'null' for None)
-- Returns {'ok', created (1 or 0), the stored result} or {'missing'} (no such job).
local key = P_JOB .. arg(1)
if redis.call('EXISTS', key) == 0 then return {'missing'} end
local field = 'step:' .. arg(2)
if redis.call('HSETNX', key, field, arg(3)) == 1 then return {'ok', 1, arg(3)} end
return {'ok', 0, redis.call('HGET', key, field)}
