-- conveyor: no transaction
-- Promotion takes the due scheduled jobs of all queues in run_at order, LIMIT n. The
-- (queue, run_at) index cannot give that order across queues, so the plan read and sorted every
-- due job to return n; this one reads n. CONCURRENTLY: enqueues go on while it is built (the
-- runner drops an invalid leftover of a build that failed and builds it again).
CREATE INDEX CONCURRENTLY IF NOT EXISTS conveyor_jobs_due ON conveyor_jobs (run_at) WHERE state = 'scheduled';
