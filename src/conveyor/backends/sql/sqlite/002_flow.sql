-- Fair sharing, the unique window after success, exactly-once step records and cron ticks.

ALTER TABLE conveyor_jobs ADD COLUMN fair_key TEXT;
-- Start-time fair queuing tag (see backends/base.py): the claim orders by it after priority.
ALTER TABLE conveyor_jobs ADD COLUMN fair_tag INTEGER NOT NULL DEFAULT 0;
-- Seconds after success during which the job still answers for its unique_key.
ALTER TABLE conveyor_jobs ADD COLUMN unique_for REAL;
-- Exactly-once steps done: {"step": result}; deleted with the job.
ALTER TABLE conveyor_jobs ADD COLUMN steps TEXT NOT NULL DEFAULT '{}';

DROP INDEX conveyor_jobs_claim;
CREATE INDEX conveyor_jobs_claim ON conveyor_jobs (queue, priority, fair_tag, run_at, id) WHERE state = 'available';
CREATE INDEX conveyor_jobs_unique_done ON conveyor_jobs (unique_key, finished_at)
    WHERE unique_key IS NOT NULL AND state = 'succeeded';

-- Virtual time of each (queue, priority): the largest fair tag a claim handed out there.
-- Each priority is its own round, so an urgent job cannot move the clock of the others.
CREATE TABLE conveyor_queue_clock (
    queue    TEXT NOT NULL,
    priority INTEGER NOT NULL,
    vtime    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, priority)
) WITHOUT ROWID;

-- The tag of each fair key's last job per (queue, priority); rows at or below vtime mean nothing.
CREATE TABLE conveyor_fair_tags (
    queue    TEXT NOT NULL,
    priority INTEGER NOT NULL,
    fair_key TEXT NOT NULL,
    last_tag INTEGER NOT NULL,
    PRIMARY KEY (queue, priority, fair_key)
) WITHOUT ROWID;

-- The last tick taken per cron schedule: the compare-and-set that makes a tick enqueue once.
CREATE TABLE conveyor_cron (
    name       TEXT PRIMARY KEY,
    last_tick  REAL NOT NULL,
    updated_at REAL NOT NULL
) WITHOUT ROWID;
