-- One table, one state column; the CHECKs make an inconsistent write fail loudly.
CREATE TABLE conveyor_jobs (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused, so a job id names one job forever
    queue            TEXT    NOT NULL,
    task             TEXT    NOT NULL,
    args             TEXT    NOT NULL DEFAULT '{}',
    state            TEXT    NOT NULL,
    priority         INTEGER NOT NULL DEFAULT 0,        -- lower runs first
    run_at           REAL    NOT NULL,                  -- unix seconds: due time
    attempt          INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL,
    timeout_s        REAL    NOT NULL,
    lease_token      TEXT,
    lease_expires_at REAL,
    worker_id        TEXT,
    unique_key       TEXT,
    errors           TEXT    NOT NULL DEFAULT '[]',
    result           TEXT,
    meta             TEXT    NOT NULL DEFAULT '{}',
    created_at       REAL    NOT NULL,
    attempted_at     REAL,
    finished_at      REAL,
    CONSTRAINT state_valid CHECK (state IN ('scheduled', 'available', 'running', 'succeeded', 'dead', 'cancelled')),
    CONSTRAINT lease_iff_running CHECK ((state = 'running') = (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL)),
    CONSTRAINT finished_iff_final CHECK ((state IN ('succeeded', 'dead', 'cancelled')) = (finished_at IS NOT NULL)),
    CONSTRAINT attempts_sane CHECK (max_attempts > 0 AND attempt >= 0 AND attempt <= max_attempts),
    CONSTRAINT queue_len CHECK (length(queue) BETWEEN 1 AND 128),
    CONSTRAINT task_len CHECK (length(task) BETWEEN 1 AND 255),
    CONSTRAINT timeout_positive CHECK (timeout_s > 0)
);

-- Matches the claim's WHERE and ORDER BY exactly.
CREATE INDEX conveyor_jobs_claim ON conveyor_jobs (queue, priority, run_at, id) WHERE state = 'available';
-- Oldest waiting job per queue, whatever its priority.
CREATE INDEX conveyor_jobs_waiting_age ON conveyor_jobs (queue, run_at) WHERE state = 'available';
CREATE INDEX conveyor_jobs_scheduled ON conveyor_jobs (queue, run_at) WHERE state = 'scheduled';
CREATE INDEX conveyor_jobs_running ON conveyor_jobs (lease_expires_at) WHERE state = 'running';
CREATE INDEX conveyor_jobs_finished ON conveyor_jobs (state, finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX conveyor_jobs_state_queue ON conveyor_jobs (state, queue, id);
-- A unique key is taken only while its job is unfinished.
CREATE UNIQUE INDEX conveyor_jobs_unique ON conveyor_jobs (unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('scheduled', 'available', 'running');

CREATE TABLE conveyor_counters (
    queue TEXT NOT NULL,
    name  TEXT NOT NULL,
    value INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, name)
) WITHOUT ROWID;

CREATE TABLE conveyor_workers (
    id          TEXT PRIMARY KEY,
    queues      TEXT NOT NULL,
    concurrency INTEGER NOT NULL,
    host        TEXT NOT NULL,
    pid         INTEGER NOT NULL,
    started_at  REAL NOT NULL,
    last_seen   REAL NOT NULL,
    running     INTEGER NOT NULL DEFAULT 0
);
