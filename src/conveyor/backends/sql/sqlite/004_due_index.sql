-- Promotion takes the due scheduled jobs of all queues in run_at order, LIMIT n. The
-- (queue, run_at) index cannot give that order across queues, so the plan skip-scanned it and
-- sorted every due job in a temporary B-tree to return n; this one reads n.
CREATE INDEX conveyor_jobs_due ON conveyor_jobs (run_at) WHERE state = 'scheduled';
