-- Cron controls (issue 38): per schedule, the job of its latest tick that made one, and when it
-- was disabled (NULL while enabled) or last enabled again (ticks before that are skipped).
-- Columns without a default: nothing to rewrite, whatever the table holds.
ALTER TABLE conveyor_cron ADD COLUMN last_job_id INTEGER;
ALTER TABLE conveyor_cron ADD COLUMN disabled_at REAL;
ALTER TABLE conveyor_cron ADD COLUMN enabled_at REAL;
