-- Job uids: 128 random bits per job (Job.uid), which step records are checked against. Ids
-- come from a sequence, and a restore (or a failover that lost the last commits) hands the
-- same ids out again; a uid is never the same for two jobs.

-- Nullable, no default in the ADD: only the catalog changes, no rewrite of the table. The
-- default is set after, and applies to new rows only (existing rows keep NULL: a job stored
-- before uids, which step records then match by id and a NULL uid, as before). Both take the
-- table's lock for an instant, retried under the short lock_timeout (see pg_migrate.py).
ALTER TABLE conveyor_jobs ADD COLUMN uid text;
ALTER TABLE conveyor_jobs ALTER COLUMN uid SET DEFAULT replace(gen_random_uuid()::text, '-', '');
