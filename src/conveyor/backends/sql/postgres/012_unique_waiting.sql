-- conveyor: no transaction
-- A job waiting for its parents is unfinished, so it holds its unique_key as a scheduled,
-- available or running one does. The new index's predicate is implied by the old one's, so a
-- producer of the previous version (ON CONFLICT ... state IN ('scheduled', 'available',
-- 'running')) still finds it as its arbiter during a rolling upgrade. Built CONCURRENTLY before
-- the old index goes: enqueues go on, and a key is never left unguarded.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS conveyor_jobs_unique_unfinished ON conveyor_jobs (unique_key) WHERE unique_key IS NOT NULL AND state IN ('waiting', 'scheduled', 'available', 'running');
DROP INDEX CONCURRENTLY IF EXISTS conveyor_jobs_unique;
