-- A broker companion's outbox (Backend.outbox_sweep): the jobs whose message the broker has not
-- confirmed yet, and since when. A new table: nothing existing is read or locked, and a store
-- that is no companion never writes it.
CREATE TABLE IF NOT EXISTS conveyor_outbox (
    job_id bigint PRIMARY KEY,
    at     double precision NOT NULL
);
CREATE INDEX IF NOT EXISTS conveyor_outbox_at ON conveyor_outbox (at);
