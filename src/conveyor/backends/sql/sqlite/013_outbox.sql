-- A broker companion's outbox (Backend.outbox_sweep): the jobs whose message the broker has not
-- confirmed yet, and since when. A table of its own: a store that is no companion never writes
-- it, and a companion's confirmed jobs leave it.
CREATE TABLE conveyor_outbox (
    job_id INTEGER PRIMARY KEY,
    at     REAL NOT NULL
);
CREATE INDEX conveyor_outbox_at ON conveyor_outbox (at);
