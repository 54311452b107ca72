-- History (issue 38): per queue, per minute counts the workers add to (processed, failed,
-- dead, and the sums of pickup latency and run time), rolled up into hourly rows after a day.
-- span is 60 for a minute row, 3600 for an hour row; bucket is its start (unix seconds).
CREATE TABLE conveyor_history (
    span      INTEGER NOT NULL,
    bucket    INTEGER NOT NULL,
    queue     TEXT NOT NULL,
    processed INTEGER NOT NULL DEFAULT 0,
    failed    INTEGER NOT NULL DEFAULT 0,
    dead      INTEGER NOT NULL DEFAULT 0,
    wait_sum  REAL NOT NULL DEFAULT 0,
    run_sum   REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (span, bucket, queue)
) WITHOUT ROWID;
