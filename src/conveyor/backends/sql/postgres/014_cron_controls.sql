-- Cron controls (issue 38): per schedule, the job of its latest tick that made one, and when it
-- was disabled (NULL while enabled) or last enabled again (ticks before that are skipped), in
-- unix seconds as last_tick is. Nullable columns without a default: no table rewrite.
ALTER TABLE conveyor_cron
    ADD COLUMN IF NOT EXISTS last_job_id bigint,
    ADD COLUMN IF NOT EXISTS disabled_at double precision,
    ADD COLUMN IF NOT EXISTS enabled_at double precision;
