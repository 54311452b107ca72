-- conveyor: no transaction
-- get_batch and prune find a batch's members and callbacks by these. Partial: only the jobs of
-- batches are in them. CONCURRENTLY: enqueues go on while they are built.
CREATE INDEX CONCURRENTLY IF NOT EXISTS conveyor_jobs_batch ON conveyor_jobs (batch_id) WHERE batch_id IS NOT NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS conveyor_jobs_callback ON conveyor_jobs (callback_of) WHERE callback_of IS NOT NULL;
