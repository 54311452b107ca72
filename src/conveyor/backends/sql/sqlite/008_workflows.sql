-- Workflows (issue 35): jobs that wait for other jobs, and batches. Every change here is to the
-- schema only, whatever the table holds: columns added without an expression default, new
-- tables, and the text of two constraints edited in place (below).

-- The parents a job was enqueued after (a JSON array, ascending; NULL for none), how many of
-- them have not finished yet, and what a failed parent does to it.
ALTER TABLE conveyor_jobs ADD COLUMN parents TEXT;
ALTER TABLE conveyor_jobs ADD COLUMN waiting_on INTEGER NOT NULL DEFAULT 0;
ALTER TABLE conveyor_jobs ADD COLUMN on_parent_failure TEXT NOT NULL DEFAULT 'cancel';
ALTER TABLE conveyor_jobs ADD COLUMN batch_id TEXT;
ALTER TABLE conveyor_jobs ADD COLUMN callback_of TEXT;
-- Set once a job is named in another's after=: a transition that finishes a job looks for
-- children only when its own row says it has some, so ordinary jobs pay nothing for them.
ALTER TABLE conveyor_jobs ADD COLUMN has_children INTEGER NOT NULL DEFAULT 0;

-- One row per (parent, child); settled once the parent's finish was counted for the child
-- (at enqueue for a parent already finished), so a redriven parent finishing again counts
-- for no child twice. The key serves the parent's lookups; a child's rows are found from its
-- parents column.
CREATE TABLE conveyor_job_deps (
    parent_id INTEGER NOT NULL,
    child_id  INTEGER NOT NULL,
    settled   INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (parent_id, child_id)
) WITHOUT ROWID;

-- A batch and its callbacks' ids (written as the callbacks are enqueued).
CREATE TABLE conveyor_batches (
    id          TEXT PRIMARY KEY,
    parent_id   TEXT,
    created_at  REAL NOT NULL,
    on_success  INTEGER,
    on_complete INTEGER
) WITHOUT ROWID;
CREATE INDEX conveyor_batches_parent ON conveyor_batches (parent_id) WHERE parent_id IS NOT NULL;

-- A batch's members. A table of its own rather than an index on jobs.batch_id: building that
-- index would read the whole jobs table under the write lock.
CREATE TABLE conveyor_batch_jobs (
    batch_id TEXT NOT NULL,
    job_id   INTEGER NOT NULL,
    PRIMARY KEY (batch_id, job_id)
) WITHOUT ROWID;

-- The 'waiting' state, in the state CHECK and in the unique index's predicate (a waiting job
-- holds its unique key, as every unfinished job does). SQLite cannot alter a CHECK, and
-- rebuilding the table or the index reads every row under the write lock. No stored row is
-- 'waiting' yet, so the looser CHECK holds for every row and the index with the wider
-- predicate holds exactly the entries it holds now: editing the schema's text is the change
-- SQLite documents for this case (lang_altertable.html, "making other kinds of table schema
-- changes"). The ALTERs above come first: ADD COLUMN splices the table's text at an offset
-- read from the parsed schema, which this edit would make stale. The ALTERs also change the
-- schema cookie, so other connections reread the schema, with this edit, when this commits.
PRAGMA writable_schema = ON;
UPDATE sqlite_master
SET sql = replace(sql, 'CHECK (state IN (''scheduled'', ''available'', ''running'', ''succeeded''',
                       'CHECK (state IN (''waiting'', ''scheduled'', ''available'', ''running'', ''succeeded''')
WHERE type = 'table' AND name = 'conveyor_jobs';
UPDATE sqlite_master
SET sql = replace(sql, 'state IN (''scheduled'', ''available'', ''running'')',
                       'state IN (''waiting'', ''scheduled'', ''available'', ''running'')')
WHERE type = 'index' AND name = 'conveyor_jobs_unique';
PRAGMA writable_schema = RESET;
-- Both edits must have matched: json() of text that is not JSON fails the migration, which
-- then leaves the store as it was.
SELECT CASE WHEN (SELECT count(*) FROM sqlite_master
                  WHERE name IN ('conveyor_jobs', 'conveyor_jobs_unique')
                    AND sql LIKE '%state IN (''waiting'', ''scheduled'', ''available'', ''running''%') = 2
            THEN 1 ELSE json('migration 008: the state CHECK or the unique index was not found') END;
