-- Slots of a worker held by threads of sync tasks running past their job's timeout (see
-- WorkerInfo.stuck). Workers of an older version do not write it: it stays 0 for them. A
-- constant default: no table rewrite (and the table holds one row per live worker).
ALTER TABLE conveyor_workers ADD COLUMN stuck integer NOT NULL DEFAULT 0;
