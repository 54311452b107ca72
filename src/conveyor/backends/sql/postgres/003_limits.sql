-- Concurrency and rate limits, checked by the claim (see backends/base.py).

-- Nullable, no default: added without rewriting the table. NOT VALID: every existing row has
-- NULLs, which pass; skip the scan of the whole table to prove it (new writes are checked).
ALTER TABLE conveyor_jobs
    ADD COLUMN concurrency_key   text,
    ADD COLUMN concurrency_limit integer,
    ADD COLUMN rate_key          text,
    ADD COLUMN rate_limit        integer,
    ADD COLUMN rate_period       double precision,
    ADD CONSTRAINT concurrency_limit_positive CHECK (concurrency_limit > 0) NOT VALID,
    ADD CONSTRAINT concurrency_together
        CHECK ((concurrency_key IS NULL) = (concurrency_limit IS NULL)) NOT VALID,
    -- A finite period: the claim turns it into an interval (NaN and Infinity fail here, not there).
    ADD CONSTRAINT rate_positive
        CHECK (rate_limit > 0 AND rate_period > 0 AND rate_period < 'Infinity'::float8) NOT VALID,
    ADD CONSTRAINT rate_together
        CHECK ((rate_key IS NULL) = (rate_limit IS NULL) AND (rate_key IS NULL) = (rate_period IS NULL)) NOT VALID;

-- Running jobs per concurrency key: few rows (bounded by the workers' slots), so a count is cheap.
CREATE INDEX conveyor_jobs_concurrency ON conveyor_jobs (concurrency_key)
    WHERE state = 'running' AND concurrency_key IS NOT NULL;

-- One row per claim of a rate-limited job, kept for its window; the claim counts them and
-- prune deletes the expired ones. The id is only a primary key (prune deletes by it; logical
-- replication needs one to publish deletes).
CREATE TABLE conveyor_rate_claims (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rate_key   text        NOT NULL,
    at         timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    job_id     bigint      NOT NULL
);
CREATE INDEX conveyor_rate_claims_key ON conveyor_rate_claims (rate_key, at);
CREATE INDEX conveyor_rate_claims_expiry ON conveyor_rate_claims (expires_at);
