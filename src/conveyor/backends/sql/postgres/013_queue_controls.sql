-- Queue controls (issue 38): a queue is paused while its row has a paused_at (the time of the
-- pause). Every claim statement looks the claimed queue up here by its key (NOT EXISTS), one
-- index probe in a table with a row per paused queue. A new table: nothing else changes, and
-- a worker of the previous release, which does not look here, keeps working as before.
CREATE TABLE IF NOT EXISTS conveyor_queue_controls (
    queue     text PRIMARY KEY,
    paused_at timestamptz
);
