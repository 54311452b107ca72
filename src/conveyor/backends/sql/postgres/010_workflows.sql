-- Workflows (backends/base.py, "Dependencies"): the waiting state, the edges from a job to the
-- jobs enqueued after it, batches, and the trigger that settles a finished job's children.

-- Nullable or constant defaults: only the catalog changes, no rewrite of the table.
-- has_children: set (under the parent's row lock) by the enqueue of a job after it, so the
-- settling trigger below fires for this job's finish and for no other job's.
-- parents_left: the parents of a waiting job that have not finished yet.
ALTER TABLE conveyor_jobs
    ADD COLUMN has_children      boolean NOT NULL DEFAULT false,
    ADD COLUMN parents           bigint[],
    ADD COLUMN parents_left      integer,
    ADD COLUMN on_parent_failure text,
    ADD COLUMN batch_id          text,
    ADD COLUMN callback_of       text,
    ADD CONSTRAINT on_parent_failure_valid
        CHECK (on_parent_failure IN ('cancel', 'run')) NOT VALID;

-- The new state. NOT VALID: every existing row passed the old, narrower check; skip the scan
-- of the whole table to prove it again (new writes are checked).
ALTER TABLE conveyor_jobs DROP CONSTRAINT state_valid;
ALTER TABLE conveyor_jobs ADD CONSTRAINT state_valid
    CHECK (state IN ('waiting', 'scheduled', 'available', 'running', 'succeeded', 'dead', 'cancelled'))
    NOT VALID;

-- One row per (parent, child). done: the parent's finish was counted for the child (or the
-- child was written after it); a redriven parent that finishes again is not counted twice.
-- No foreign keys: they would add a trigger to every delete and update of conveyor_jobs; prune
-- deletes the edges of the jobs it deletes.
CREATE TABLE conveyor_edges (
    parent_id bigint  NOT NULL,
    child_id  bigint  NOT NULL,
    done      boolean NOT NULL DEFAULT false,
    PRIMARY KEY (parent_id, child_id)
);

CREATE TABLE conveyor_batches (
    id         text        PRIMARY KEY,
    parent_id  text,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX conveyor_batches_parent ON conveyor_batches (parent_id) WHERE parent_id IS NOT NULL;

-- The indexes over batch_id and callback_of are built CONCURRENTLY by 011.

-- Settles the waiting children of a job that reached a final state, in the transaction of the
-- statement that finished it (ack, ack_many, ack_claim, retry, kill, reap, cancel, and a
-- task's transactional completion). A row trigger fired after the statement: plpgsql is
-- VOLATILE, so each query here takes a fresh snapshot and sees a child whose enqueue committed
-- while the finishing statement waited for the parent's row lock (the enqueue locks the parent
-- to set has_children). The cascade (a cancelled child's own children) runs here in a loop,
-- not by the trigger firing again (its WHEN asks pg_trigger_depth() = 0): a long chain never
-- nests. The time is the parent's finished_at: the finishing statement's (injected) now.
CREATE FUNCTION conveyor_settle_children() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    todo   bigint[] := ARRAY[NEW.id];
    failed boolean[] := ARRAY[NEW.state <> 'succeeded'];
    at     timestamptz := NEW.finished_at;
    parent bigint;
    bad    boolean;
    kid    record;
    woken  text[] := ARRAY[]::text[];
    q      text;
BEGIN
    WHILE cardinality(todo) > 0 LOOP
        parent := todo[1];
        bad := failed[1];
        todo := todo[2:];
        failed := failed[2:];
        FOR kid IN
            WITH edges AS (
                UPDATE conveyor_edges SET done = true
                WHERE parent_id = parent AND NOT done
                RETURNING child_id
            ), locked AS MATERIALIZED (
                -- Children locked in id order, as every multi-row write here locks.
                SELECT j.id FROM conveyor_jobs AS j
                WHERE j.id IN (SELECT child_id FROM edges) AND j.state = 'waiting'
                ORDER BY j.id
                FOR NO KEY UPDATE
            )
            UPDATE conveyor_jobs AS j
            SET parents_left = j.parents_left - 1,
                state = CASE WHEN bad AND j.on_parent_failure = 'cancel' THEN 'cancelled'
                             WHEN j.parents_left > 1 THEN 'waiting'
                             WHEN j.run_at > at THEN 'scheduled' ELSE 'available' END,
                finished_at = CASE WHEN bad AND j.on_parent_failure = 'cancel' THEN at END,
                errors = CASE WHEN bad AND j.on_parent_failure = 'cancel'
                              THEN j.errors || jsonb_build_array(jsonb_build_object(
                                  'attempt', j.attempt, 'at', extract(epoch FROM at)::float8,
                                  'kind', 'parent_failed', 'type', 'ParentFailed',
                                  'message', 'parent job ' || parent || ' went dead or was cancelled',
                                  'traceback', '', 'worker_id', NULL))
                              ELSE j.errors END,
                -- A job leaving waiting joins the current round, as a new job does.
                fair_tag = CASE WHEN j.fair_key IS NULL AND j.parents_left <= 1
                                     AND NOT (bad AND j.on_parent_failure = 'cancel')
                                THEN coalesce((SELECT c.vtime + 1 FROM conveyor_queue_clock AS c
                                               WHERE c.queue = j.queue AND c.priority = j.priority),
                                              1)
                                ELSE j.fair_tag END
            FROM locked
            WHERE j.id = locked.id AND j.state = 'waiting'
            RETURNING j.id, j.queue, j.state, j.has_children, j.waited
        LOOP
            IF kid.state = 'cancelled' THEN
                IF kid.waited THEN
                    PERFORM pg_notify('conveyor_done', kid.id::text);
                END IF;
                IF kid.has_children THEN
                    todo := todo || kid.id;
                    failed := failed || true;
                END IF;
            ELSIF kid.state = 'available' AND NOT kid.queue = ANY(woken) THEN
                woken := woken || kid.queue;
            END IF;
        END LOOP;
    END LOOP;
    -- Wake idle workers of the queues a child became available in, as an enqueue does
    -- (delivered at commit; repeats within a transaction are folded into one).
    FOREACH q IN ARRAY woken LOOP
        PERFORM pg_notify('conveyor_wake', q);
    END LOOP;
    RETURN NULL;
END
$$;

-- Fires only for a job some job was enqueued after, on its way into a final state: an
-- ordinary job's finish (has_children false) pays for the WHEN alone.
CREATE TRIGGER conveyor_settle_children
    AFTER UPDATE ON conveyor_jobs
    FOR EACH ROW
    WHEN (NEW.has_children AND NEW.state IN ('succeeded', 'dead', 'cancelled')
          AND OLD.state IS DISTINCT FROM NEW.state AND pg_trigger_depth() = 0)
    EXECUTE FUNCTION conveyor_settle_children();
