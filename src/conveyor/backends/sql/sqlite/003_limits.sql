-- Concurrency and rate limits, checked by the claim.

ALTER TABLE conveyor_jobs ADD COLUMN concurrency_key TEXT;
ALTER TABLE conveyor_jobs ADD COLUMN concurrency_limit INTEGER CHECK (concurrency_limit IS NULL OR concurrency_limit > 0);
ALTER TABLE conveyor_jobs ADD COLUMN rate_key TEXT;
ALTER TABLE conveyor_jobs ADD COLUMN rate_limit INTEGER CHECK (rate_limit IS NULL OR rate_limit > 0);
ALTER TABLE conveyor_jobs ADD COLUMN rate_period REAL CHECK (rate_period IS NULL OR rate_period > 0);

-- Running jobs per concurrency key: few rows (bounded by the workers' slots), so a count is cheap.
CREATE INDEX conveyor_jobs_concurrency ON conveyor_jobs (concurrency_key)
    WHERE state = 'running' AND concurrency_key IS NOT NULL;

-- One row per claim of a rate-limited job, kept for its window; the claim counts them.
CREATE TABLE conveyor_rate_claims (
    rate_key   TEXT NOT NULL,
    at         REAL NOT NULL,
    expires_at REAL NOT NULL,
    job_id     INTEGER NOT NULL
);
CREATE INDEX conveyor_rate_claims_key ON conveyor_rate_claims (rate_key, at);
CREATE INDEX conveyor_rate_claims_expiry ON conveyor_rate_claims (expires_at);

-- Job lists filtered by state or by task alone, newest first (the dashboard on a big store).
CREATE INDEX conveyor_jobs_state_id ON conveyor_jobs (state, id);
CREATE INDEX conveyor_jobs_task_id ON conveyor_jobs (task, id);
