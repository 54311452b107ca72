-- record_step: record that a step of a job finished with a result, unless a record of that
-- step exists already (the first record wins). Not fenced: any attempt that did the step may
-- record it. The record is a field 'step:<name>' of the job's hash, so it lives and dies with
-- the job (prune and purge delete it with the hash).
-- KEYS: the common header (no queue blocks).
-- ARGV: 0; id, step name (checked by the client; the 'step:' prefix keeps it apart from the
--   job's own fields, none of which contains ':'), result (JSON text; 'null' for None), the
--   job's uid ('' for a job written before uids existed)
-- Returns {'ok', created (1 or 0), the stored result}, {'missing'} (no such job) or {'other'}
-- (the id names a job with another uid: after a data loss the id counter handed it out again,
-- and the record of the lost job's attempt must not land on the new job).
local key = P_JOB .. arg(1)
local uid = redis.call('HGET', key, 'uid')
if uid == false and redis.call('EXISTS', key) == 0 then return {'missing'} end
if (uid or '') ~= arg(4) then return {'other'} end
local field = 'step:' .. arg(2)
if redis.call('HSETNX', key, field, arg(3)) == 1 then return {'ok', 1, arg(3)} end
return {'ok', 0, redis.call('HGET', key, field)}
