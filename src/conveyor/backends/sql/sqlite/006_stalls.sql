-- An attempt counts only once its job started (see backends/base.py, claim and reap). held:
-- the job was claimed to wait in a worker's prefetch and no heartbeat has said it started yet;
-- a lease that runs out on it gives the attempt back. stalls: how many times that happened.
ALTER TABLE conveyor_jobs ADD COLUMN held INTEGER NOT NULL DEFAULT 0;
ALTER TABLE conveyor_jobs ADD COLUMN stalls INTEGER NOT NULL DEFAULT 0;
