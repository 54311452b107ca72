-- Fair sharing, the unique window after success, exactly-once step records and cron ticks.

-- Constant defaults: PostgreSQL 11+ adds these columns without rewriting the table.
ALTER TABLE conveyor_jobs
    ADD COLUMN fair_key   text,
    -- Start-time fair queuing tag (see backends/base.py): the claim orders by it after priority.
    -- Jobs from before this migration keep 0: they were waiting first, so they go first.
    ADD COLUMN fair_tag   bigint NOT NULL DEFAULT 0,
    -- Seconds after success during which the job still answers for its unique_key.
    ADD COLUMN unique_for double precision,
    -- NOT VALID: every existing row has NULL; skip the scan of the whole table to prove it.
    ADD CONSTRAINT unique_for_positive CHECK (unique_for IS NULL OR unique_for > 0) NOT VALID;

-- Matches the claim's WHERE and ORDER BY exactly (the name is kept: tests and docs refer to it).
DROP INDEX conveyor_jobs_claim;
CREATE INDEX conveyor_jobs_claim ON conveyor_jobs (queue, priority, fair_tag, run_at, id)
    WHERE state = 'available';
-- A succeeded job answering for its unique_key within its unique_for window.
CREATE INDEX conveyor_jobs_unique_done ON conveyor_jobs (unique_key, finished_at)
    WHERE unique_key IS NOT NULL AND state = 'succeeded';

-- Virtual time of each (queue, priority): the largest fair tag a claim handed out there.
-- Each priority is its own round, so an urgent job cannot move the clock of the others.
CREATE TABLE conveyor_queue_clock (
    queue    text     NOT NULL,
    priority smallint NOT NULL,
    vtime    bigint   NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, priority)
);

-- The tag of each fair key's last job per (queue, priority); rows at or below their vtime
-- mean nothing and are deleted by prune.
CREATE TABLE conveyor_fair_tags (
    queue    text     NOT NULL,
    priority smallint NOT NULL,
    fair_key text     NOT NULL,
    last_tag bigint   NOT NULL,
    PRIMARY KEY (queue, priority, fair_key)
);

-- Exactly-once steps a job has done: the first record of (job, step) wins. A table of its own
-- rather than a column of conveyor_jobs: a step recorded inside a task's own transaction
-- (JobContext.transaction) then holds only a key-share lock on the job's row until that
-- transaction ends, which heartbeat, ack, retry and cancel do not wait for. A jsonb column
-- would hold the row's update lock, stalling the worker's heartbeat for all its leases.
-- result NULL is a step that returned None (JSON null).
CREATE TABLE conveyor_steps (
    job_id     bigint NOT NULL REFERENCES conveyor_jobs (id) ON DELETE CASCADE,
    step       text   NOT NULL,
    result     jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, step)
);

-- The last tick taken per cron schedule: the compare-and-set that makes a tick enqueue once.
CREATE TABLE conveyor_cron (
    name       text             PRIMARY KEY,
    last_tick  double precision NOT NULL,
    updated_at timestamptz      NOT NULL DEFAULT now()
);
