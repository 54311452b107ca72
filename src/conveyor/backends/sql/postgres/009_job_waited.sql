-- job.wait: a waiter marks its job (waited = true) and LISTENs on conveyor_done; the
-- statements that finish a job (ack, ack_many, ack_claim, kill, retry, reap, cancel) send
-- pg_notify('conveyor_done', id) only for a marked job. A NOTIFY serializes commits on a
-- server-wide lock, so it is sent only when someone listens: unmarked jobs finish as before.

-- A constant default: only the catalog changes, no rewrite of the table.
ALTER TABLE conveyor_jobs ADD COLUMN waited boolean NOT NULL DEFAULT false;
