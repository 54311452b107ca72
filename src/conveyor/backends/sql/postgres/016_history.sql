-- History (issue 38): per queue, per minute counts the workers add to (processed, failed,
-- dead, and the sums of pickup latency and run time), rolled up into hourly rows after a day.
-- span is 60 for a minute row, 3600 for an hour row; bucket is its start (unix seconds). A new
-- table: nothing existing is read or locked.
CREATE TABLE IF NOT EXISTS conveyor_history (
    span      integer NOT NULL,
    bucket    bigint NOT NULL,
    queue     text NOT NULL,
    processed bigint NOT NULL DEFAULT 0,
    failed    bigint NOT NULL DEFAULT 0,
    dead      bigint NOT NULL DEFAULT 0,
    wait_sum  double precision NOT NULL DEFAULT 0,
    run_sum   double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (span, bucket, queue)
);
