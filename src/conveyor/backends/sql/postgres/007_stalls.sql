-- An attempt counts only once its job started (see backends/base.py, claim and reap). held:
-- the job was claimed to wait in a worker's prefetch and no heartbeat has said it started yet;
-- a lease that runs out on it gives the attempt back. stalls: how many times that happened.
-- Constant defaults: added without rewriting the table (PostgreSQL 11 and later).
ALTER TABLE conveyor_jobs
    ADD COLUMN IF NOT EXISTS held   boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS stalls integer NOT NULL DEFAULT 0;
