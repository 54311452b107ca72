-- Queue controls (issue 38): a queue is paused while its row has a paused_at (unix seconds,
-- the time of the pause). Every claim looks the claimed queue up here by its key, one read of
-- a table with a row per paused queue. A new table: nothing else in the schema changes.
CREATE TABLE conveyor_queue_controls (
    queue     TEXT PRIMARY KEY,
    paused_at REAL
) WITHOUT ROWID;
