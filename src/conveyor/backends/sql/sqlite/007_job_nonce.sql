-- Job uids: 128 random bits per job (Job.uid), which step records are checked against. Ids are
-- AUTOINCREMENT, but a store restored from a backup counts on from the backup's last id; a uid
-- is never the same for two jobs. Written by the insert (SQLite cannot add a column whose
-- default is an expression). Existing rows keep NULL: a job stored before uids, which step
-- records then match by id and a NULL uid, as before. Adding a nullable column without a
-- default changes only the schema, however many rows the table holds.
ALTER TABLE conveyor_jobs ADD COLUMN uid TEXT;
