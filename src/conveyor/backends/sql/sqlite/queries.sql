-- Named queries of the SQLite backend. Every write runs inside BEGIN IMMEDIATE, and every
-- time is :now, read from SQLite's clock at the start of the transaction (or injected).

-- name: now
SELECT (julianday('now') - 2440587.5) * 86400.0;

-- name: insert
-- Positional values, in the order of _insert_values in sqlite/writes.py: a bulk insert binds them from
-- tuples at about four fifths of the cost of named ones from dicts.
INSERT INTO conveyor_jobs (queue, task, args, state, priority, run_at, max_attempts, timeout_s,
                           unique_key, meta, created_at, fair_key, fair_tag, unique_for,
                           concurrency_key, concurrency_limit, rate_key, rate_limit, rate_period, uid)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);

-- name: insert_unique
-- Values as in insert.
INSERT INTO conveyor_jobs (queue, task, args, state, priority, run_at, max_attempts, timeout_s,
                           unique_key, meta, created_at, fair_key, fair_tag, unique_for,
                           concurrency_key, concurrency_limit, rate_key, rate_limit, rate_period, uid)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('waiting', 'scheduled', 'available', 'running')
DO NOTHING
RETURNING id;

-- name: insert_flow
-- A job with parents or in a batch: the values of insert, then parents, waiting_on,
-- on_parent_failure, batch_id, callback_of, finished_at and errors (a child cancelled at once).
INSERT INTO conveyor_jobs (queue, task, args, state, priority, run_at, max_attempts, timeout_s,
                           unique_key, meta, created_at, fair_key, fair_tag, unique_for,
                           concurrency_key, concurrency_limit, rate_key, rate_limit, rate_period, uid,
                           parents, waiting_on, on_parent_failure, batch_id, callback_of,
                           finished_at, errors)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);

-- name: insert_flow_unique
-- Values as in insert_flow.
INSERT INTO conveyor_jobs (queue, task, args, state, priority, run_at, max_attempts, timeout_s,
                           unique_key, meta, created_at, fair_key, fair_tag, unique_for,
                           concurrency_key, concurrency_limit, rate_key, rate_limit, rate_period, uid,
                           parents, waiting_on, on_parent_failure, batch_id, callback_of,
                           finished_at, errors)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('waiting', 'scheduled', 'available', 'running')
DO NOTHING
RETURNING id;

-- name: parent_states
SELECT id, state FROM conveyor_jobs WHERE id IN (SELECT value FROM json_each(:ids));

-- name: add_edge
INSERT INTO conveyor_job_deps (parent_id, child_id, settled) VALUES (?, ?, ?)
ON CONFLICT (parent_id, child_id) DO NOTHING;

-- name: mark_parents
UPDATE conveyor_jobs SET has_children = 1
WHERE id IN (SELECT value FROM json_each(:ids)) AND NOT has_children;

-- name: add_batch
INSERT INTO conveyor_batches (id, parent_id, created_at) VALUES (:id, :parent_id, :now);

-- name: add_batch_member
INSERT INTO conveyor_batch_jobs (batch_id, job_id) VALUES (?, ?);

-- name: set_on_success
UPDATE conveyor_batches SET on_success = :job_id WHERE id = :batch_id;

-- name: set_on_complete
UPDATE conveyor_batches SET on_complete = :job_id WHERE id = :batch_id;

-- name: settle_edges
-- A parent finished: the children its finish has not been counted for yet.
UPDATE conveyor_job_deps SET settled = 1 WHERE parent_id = :parent AND NOT settled
RETURNING child_id;

-- name: settle_cancel
-- A parent went dead or was cancelled: its waiting children that do not run anyway.
UPDATE conveyor_jobs
SET state = 'cancelled', finished_at = :now,
    errors = json_insert(errors, '$[#]', json_object(
        'attempt', attempt, 'at', :now, 'kind', 'parent_failed', 'type', 'ParentFailed',
        'message', :message, 'traceback', '', 'worker_id', NULL))
WHERE id IN (SELECT value FROM json_each(:children)) AND state = 'waiting'
  AND on_parent_failure = 'cancel'
RETURNING id, has_children;

-- name: settle_done
-- One parent fewer to wait for; the last one makes the child due (or scheduled).
UPDATE conveyor_jobs
SET waiting_on = waiting_on - 1,
    state = CASE WHEN waiting_on > 1 THEN 'waiting'
                 WHEN run_at > :now THEN 'scheduled' ELSE 'available' END
WHERE id IN (SELECT value FROM json_each(:children)) AND state = 'waiting'
RETURNING id, state;

-- name: batch
SELECT id, parent_id, created_at, on_success, on_complete FROM conveyor_batches WHERE id = :id;

-- name: batch_counts
-- Members of the batch and of the batches nested in it, at any depth.
WITH RECURSIVE tree(id) AS (
    SELECT :id
    UNION SELECT b.id FROM conveyor_batches AS b JOIN tree ON b.parent_id = tree.id)
SELECT j.state, count(*) AS n
FROM conveyor_batch_jobs AS m JOIN conveyor_jobs AS j ON j.id = m.job_id
WHERE m.batch_id IN (SELECT id FROM tree)
GROUP BY j.state;

-- name: forget_children
DELETE FROM conveyor_job_deps WHERE parent_id = ?;

-- name: forget_parent
DELETE FROM conveyor_job_deps WHERE parent_id = ? AND child_id = ?;

-- name: forget_member
DELETE FROM conveyor_batch_jobs WHERE batch_id = ? AND job_id = ?;

-- name: forget_batch
-- A batch goes with its last member, once no batch nested in it is left either.
DELETE FROM conveyor_batches
WHERE id = :id
  AND NOT EXISTS (SELECT 1 FROM conveyor_batch_jobs WHERE batch_id = :id)
  AND NOT EXISTS (SELECT 1 FROM conveyor_batches WHERE parent_id = :id)
RETURNING parent_id;

-- name: depth
SELECT count(*) AS n FROM conveyor_jobs WHERE queue = :queue AND state IN ('scheduled', 'available');

-- name: find_unique
SELECT id FROM conveyor_jobs
WHERE unique_key = :unique_key AND state IN ('waiting', 'scheduled', 'available', 'running');

-- name: unique_done
-- A succeeded job still answers for its key until finished_at + unique_for.
SELECT id FROM conveyor_jobs
WHERE unique_key = :unique_key AND state = 'succeeded' AND finished_at + unique_for > :now
ORDER BY finished_at DESC LIMIT 1;

-- name: vtime
SELECT vtime FROM conveyor_queue_clock WHERE queue = :queue AND priority = :priority;

-- name: last_tag
SELECT last_tag FROM conveyor_fair_tags WHERE queue = :queue AND priority = :priority AND fair_key = :fair_key;

-- name: set_last_tag
INSERT INTO conveyor_fair_tags (queue, priority, fair_key, last_tag)
VALUES (:queue, :priority, :fair_key, :last_tag)
ON CONFLICT (queue, priority, fair_key) DO UPDATE SET last_tag = max(last_tag, excluded.last_tag);

-- name: raise_vtime
INSERT INTO conveyor_queue_clock (queue, priority, vtime) VALUES (:queue, :priority, :vtime)
ON CONFLICT (queue, priority) DO UPDATE SET vtime = max(vtime, excluded.vtime);

-- name: prune_fair_tags
DELETE FROM conveyor_fair_tags
WHERE (queue, priority, fair_key) IN (
    SELECT f.queue, f.priority, f.fair_key FROM conveyor_fair_tags AS f
    JOIN conveyor_queue_clock AS c ON c.queue = f.queue AND c.priority = f.priority
    WHERE f.last_tag <= c.vtime LIMIT :limit);

-- name: cron_take
-- Compare-and-set of a schedule's last tick: changes a row only for a newer tick.
INSERT INTO conveyor_cron (name, last_tick, updated_at) VALUES (:name, :tick, :now)
ON CONFLICT (name) DO UPDATE SET last_tick = excluded.last_tick, updated_at = excluded.updated_at
WHERE last_tick < excluded.last_tick;

-- name: cron_runs
-- After cron_take, in its transaction: may the tick make a job (not disabled, not from before
-- the schedule was enabled again)? A query of its own: RETURNING after an upsert of this
-- WITHOUT ROWID table computed expressions over the row wrongly (SQLite 3.40).
SELECT disabled_at IS NULL AND (enabled_at IS NULL OR enabled_at <= :tick) AS runs
FROM conveyor_cron WHERE name = :name;

-- name: cron_last_job
UPDATE conveyor_cron SET last_job_id = :id WHERE name = :name;

-- name: cron_disable
-- A schedule no scheduler has seen starts at now, as a first sight records its latest tick.
INSERT INTO conveyor_cron (name, last_tick, updated_at, disabled_at) VALUES (:name, :now, :now, :now)
ON CONFLICT (name) DO UPDATE SET disabled_at = excluded.disabled_at, updated_at = excluded.updated_at
WHERE disabled_at IS NULL;

-- name: cron_enable
UPDATE conveyor_cron SET disabled_at = NULL, enabled_at = :now, updated_at = :now
WHERE name = :name AND disabled_at IS NOT NULL;

-- name: cron_states
SELECT name, last_tick, last_job_id, disabled_at, enabled_at FROM conveyor_cron ORDER BY name;

-- name: cron_ticks
SELECT name, last_tick FROM conveyor_cron ORDER BY name;

-- name: record_step
-- Only onto the job of this uid (NULL: a job stored before uids): after a restore, the id may
-- name another job, which must not get this one's record.
UPDATE conveyor_jobs SET steps = json_set(steps, :path, json(:result))
WHERE id = :id AND uid IS :uid AND json_type(steps, :path) IS NULL;

-- name: read_step
-- `->` gives the stored JSON text (NULL when the step is absent; 'null' for a null result).
SELECT 1 AS found, steps -> :path AS value FROM conveyor_jobs WHERE id = :id AND uid IS :uid;

-- name: promote_queue
UPDATE conveyor_jobs SET state = 'available'
WHERE id IN (SELECT id FROM conveyor_jobs
             WHERE state = 'scheduled' AND queue = :queue AND run_at <= :now
             ORDER BY run_at LIMIT :limit);

-- name: promote
UPDATE conveyor_jobs SET state = 'available'
WHERE id IN (SELECT id FROM conveyor_jobs
             WHERE state = 'scheduled' AND run_at <= :now
             ORDER BY run_at LIMIT :limit);

-- name: claim
-- Nothing of a paused queue (conveyor_queue_controls), here and in claim_candidates, the limited
-- path's only source of ids.
UPDATE conveyor_jobs
SET state = 'running',
    attempt = attempt + 1,
    attempted_at = :now,
    worker_id = :worker_id,
    lease_token = :claim_id || id,
    lease_expires_at = :now + :lease_s,
    held = 0
WHERE id IN (SELECT id FROM conveyor_jobs
             WHERE state = 'available' AND queue = :queue
               AND NOT EXISTS (SELECT 1 FROM conveyor_queue_controls AS c
                               WHERE c.queue = :queue AND c.paused_at IS NOT NULL)
             ORDER BY priority, fair_tag, run_at, id
             LIMIT :limit)
RETURNING *;

-- name: claim_candidates
-- The waiting jobs a claim looks at when limits may hold some back, in claim order.
SELECT id, concurrency_key, concurrency_limit, rate_key, rate_limit, rate_period
FROM conveyor_jobs
WHERE state = 'available' AND queue = :queue
  AND NOT EXISTS (SELECT 1 FROM conveyor_queue_controls AS c
                  WHERE c.queue = :queue AND c.paused_at IS NOT NULL)
ORDER BY priority, fair_tag, run_at, id
LIMIT :limit OFFSET :offset;

-- name: claim_ids
UPDATE conveyor_jobs
SET state = 'running',
    attempt = attempt + 1,
    attempted_at = :now,
    worker_id = :worker_id,
    lease_token = :claim_id || id,
    lease_expires_at = :now + :lease_s,
    held = 0
WHERE id IN (SELECT value FROM json_each(:ids)) AND state = 'available'
RETURNING *;

-- name: take
-- A broker's delivery (Backend.take): the job by id, whatever its run_at and whatever lease it
-- held. A lease it held was lost (the broker handed the message out again): recorded as reap
-- records an expiry, and if that was its last attempt the job goes dead instead (spent).
-- SET reads the row as it was, so every CASE sees the old state, attempt and worker.
UPDATE conveyor_jobs
SET errors = CASE WHEN state = 'running' THEN json_insert(
                 CASE WHEN json_array_length(errors) >= :keep_errors
                      THEN json_remove(errors, '$[0]') ELSE errors END,
                 '$[#]', json_object(
                     'attempt', attempt, 'at', :now, 'kind', 'lease_expired',
                     'type', 'LeaseExpired',
                     'message', 'the broker handed the job out again: worker '
                                || coalesce(worker_id, '?') || ' stopped answering'
                                || CASE WHEN attempt >= max_attempts
                                        THEN '; no attempts left' ELSE '' END,
                     'traceback', '', 'worker_id', worker_id))
             ELSE errors END,
    state = CASE WHEN state = 'running' AND attempt >= max_attempts THEN 'dead'
                 ELSE 'running' END,
    finished_at = CASE WHEN state = 'running' AND attempt >= max_attempts THEN :now END,
    attempt = CASE WHEN state = 'running' AND attempt >= max_attempts THEN attempt
                   ELSE attempt + 1 END,
    attempted_at = CASE WHEN state = 'running' AND attempt >= max_attempts THEN attempted_at
                        ELSE :now END,
    worker_id = CASE WHEN state = 'running' AND attempt >= max_attempts THEN worker_id
                     ELSE :worker_id END,
    lease_token = CASE WHEN state = 'running' AND attempt >= max_attempts THEN NULL
                       ELSE :token END,
    lease_expires_at = CASE WHEN state = 'running' AND attempt >= max_attempts THEN NULL
                            ELSE :now + :lease_s END,
    held = 0
WHERE id = :id AND state IN ('available', 'scheduled', 'running')
  -- Not a live lease given for this very message (Backend.take's ``message``).
  AND NOT (state = 'running' AND lease_expires_at > :now AND :message IS NOT NULL
           AND substr(lease_token, -length(:message)) = :message)
RETURNING *;

-- name: hold
-- The jobs of a claim beyond its ``start``: they wait in the worker's prefetch, not started.
UPDATE conveyor_jobs SET held = 1 WHERE id IN (SELECT value FROM json_each(:ids));

-- name: release_claim
-- A claim whose reply was lost: its jobs back unrun, found by the claim id their tokens begin with.
UPDATE conveyor_jobs
SET state = 'available', attempt = attempt - 1,
    lease_token = NULL, lease_expires_at = NULL, worker_id = NULL
WHERE state = 'running' AND queue = :queue AND substr(lease_token, 1, 24) = :claim_id
RETURNING id;

-- name: running_with_key
SELECT count(*) FROM conveyor_jobs WHERE state = 'running' AND concurrency_key = :key;

-- name: rate_claims
SELECT count(*) FROM conveyor_rate_claims WHERE rate_key = :key AND at > :since;

-- name: add_rate_claim
INSERT INTO conveyor_rate_claims (rate_key, at, expires_at, job_id) VALUES (:key, :now, :expires_at, :id);

-- name: prune_rate_claims
DELETE FROM conveyor_rate_claims
WHERE rowid IN (SELECT rowid FROM conveyor_rate_claims WHERE expires_at < :now LIMIT :limit);

-- name: heartbeat
-- A job the worker no longer holds (:held false) has started: its expiry counts from now on.
UPDATE conveyor_jobs SET lease_expires_at = :now + :lease_s, held = held AND :held
WHERE id = :id AND lease_token = :token AND state = 'running' AND lease_expires_at >= :now;

-- name: ack
UPDATE conveyor_jobs
SET state = 'succeeded', result = :result, finished_at = :now,
    lease_token = NULL, lease_expires_at = NULL
WHERE id = :id AND lease_token = :token AND state = 'running' AND lease_expires_at >= :now
RETURNING has_children;

-- name: retry
UPDATE conveyor_jobs
SET state = CASE WHEN attempt >= max_attempts THEN 'dead'
                 WHEN :delay > 0 THEN 'scheduled' ELSE 'available' END,
    run_at = CASE WHEN attempt >= max_attempts THEN run_at ELSE :now + max(:delay, 0) END,
    finished_at = CASE WHEN attempt >= max_attempts THEN :now END,
    errors = json_insert(CASE WHEN json_array_length(errors) >= :keep_errors
                              THEN json_remove(errors, '$[0]') ELSE errors END,
                         '$[#]', json(:error)),
    lease_token = NULL, lease_expires_at = NULL
WHERE id = :id AND lease_token = :token AND state = 'running' AND lease_expires_at >= :now
RETURNING state, has_children;

-- name: kill
UPDATE conveyor_jobs
SET state = 'dead', finished_at = :now,
    errors = json_insert(CASE WHEN json_array_length(errors) >= :keep_errors
                              THEN json_remove(errors, '$[0]') ELSE errors END,
                         '$[#]', json(:error)),
    lease_token = NULL, lease_expires_at = NULL
WHERE id = :id AND lease_token = :token AND state = 'running' AND lease_expires_at >= :now
RETURNING has_children;

-- name: release
UPDATE conveyor_jobs
SET state = 'available', attempt = attempt - 1,
    lease_token = NULL, lease_expires_at = NULL, worker_id = NULL
WHERE id = :id AND lease_token = :token AND state = 'running';

-- name: reap
-- A job claimed held that never started (see backends/base.py) goes back uncounted, as a
-- stall, while it has stalled fewer than :max_stalls times; past that its expiry counts.
UPDATE conveyor_jobs
SET state = CASE WHEN held AND stalls < :max_stalls THEN 'available'
                 WHEN attempt >= max_attempts THEN 'dead' ELSE 'available' END,
    finished_at = CASE WHEN NOT (held AND stalls < :max_stalls) AND attempt >= max_attempts THEN :now END,
    attempt = CASE WHEN held AND stalls < :max_stalls THEN attempt - 1 ELSE attempt END,
    stalls = CASE WHEN held AND stalls < :max_stalls THEN stalls + 1 ELSE stalls END,
    errors = json_insert(CASE WHEN json_array_length(errors) >= :keep_errors
                              THEN json_remove(errors, '$[0]') ELSE errors END,
                         '$[#]', json_object(
                             'attempt', attempt, 'at', :now, 'kind', 'lease_expired', 'type', 'LeaseExpired',
                             'message', CASE
                                 WHEN NOT held THEN 'lease expired mid-job: worker ' || coalesce(worker_id, '?')
                                      || ' stopped heartbeating (crashed, killed or stalled)'
                                 WHEN stalls < :max_stalls THEN 'lease expired before the job started (as far as'
                                      || ' the store knows): worker ' || coalesce(worker_id, '?') || ' held it'
                                      || ' (prefetched, or the reply to its claim was lost) and stopped heartbeating;'
                                      || ' attempt not counted'
                                 ELSE 'lease expired before the job started, ' || (stalls + 1)
                                      || ' times: counted as an attempt; worker ' || coalesce(worker_id, '?')
                                      || ' stopped heartbeating' END,
                             'traceback', '', 'worker_id', worker_id)),
    lease_token = NULL, lease_expires_at = NULL, held = 0
WHERE id IN (SELECT id FROM conveyor_jobs
             WHERE state = 'running' AND lease_expires_at < :now
             ORDER BY lease_expires_at LIMIT :limit)
RETURNING id, queue, state, has_children;

-- name: count_up
INSERT INTO conveyor_counters (queue, name, value) VALUES (:queue, :name, :n)
ON CONFLICT (queue, name) DO UPDATE SET value = value + excluded.value;

-- name: get
SELECT * FROM conveyor_jobs WHERE id = :id;

-- name: redrive
-- A dead job whose unique_key a newer unfinished job holds stays dead: reviving it
-- would break uniqueness (the newer job is doing its work).
UPDATE conveyor_jobs
SET state = 'available', attempt = 0, run_at = :now, finished_at = NULL, worker_id = NULL,
    meta = json_set(meta, '$.redriven', coalesce(json_extract(meta, '$.redriven'), 0) + 1)
WHERE id = :id AND state = 'dead'
  AND (unique_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM conveyor_jobs AS o
        WHERE o.unique_key = conveyor_jobs.unique_key
          AND o.state IN ('waiting', 'scheduled', 'available', 'running')))
RETURNING id, queue, priority, fair_key;

-- name: redrive_all
UPDATE conveyor_jobs
SET state = 'available', attempt = 0, run_at = :now, finished_at = NULL, worker_id = NULL,
    meta = json_set(meta, '$.redriven', coalesce(json_extract(meta, '$.redriven'), 0) + 1)
WHERE state = 'dead' AND (:queue IS NULL OR queue = :queue) AND unique_key IS NULL
RETURNING id, queue, priority, fair_key;

-- name: set_fair_tag
UPDATE conveyor_jobs SET fair_tag = :fair_tag WHERE id = :id;

-- name: dead_with_unique_key
SELECT id FROM conveyor_jobs
WHERE state = 'dead' AND (:queue IS NULL OR queue = :queue) AND unique_key IS NOT NULL
ORDER BY id DESC;

-- name: cancel
UPDATE conveyor_jobs
SET state = 'cancelled', finished_at = :now, lease_token = NULL, lease_expires_at = NULL
WHERE id = :id AND state IN ('waiting', 'scheduled', 'available', 'running')
RETURNING has_children;

-- name: prune
-- A finished parent stays while a child of its is unfinished (the child may read its result).
-- Only rows that have children look at them.
DELETE FROM conveyor_jobs
WHERE id IN (SELECT id FROM conveyor_jobs AS p
             WHERE state = :state AND finished_at < :before
               AND CASE WHEN has_children THEN NOT EXISTS (
                       SELECT 1 FROM conveyor_job_deps AS d JOIN conveyor_jobs AS c ON c.id = d.child_id
                       WHERE d.parent_id = p.id
                         AND c.state IN ('waiting', 'scheduled', 'available', 'running'))
                   ELSE 1 END
             ORDER BY finished_at LIMIT :limit)
RETURNING id, has_children, parents, batch_id;

-- name: count_by_state
SELECT queue, state, count(*) AS n FROM conveyor_jobs GROUP BY queue, state;

-- name: count_unfinished
-- Reads the (state, queue, id) index for these states only: cost follows the backlog and
-- the dead-letter queue, not the retained history.
SELECT queue, state, count(*) AS n FROM conveyor_jobs
WHERE state IN ('waiting', 'scheduled', 'available', 'running', 'dead') GROUP BY queue, state;

-- name: due_scheduled
SELECT queue, count(*) AS n, min(run_at) AS oldest FROM conveyor_jobs
WHERE state = 'scheduled' AND run_at <= :now GROUP BY queue;

-- name: oldest_available
SELECT queue, min(run_at) AS oldest FROM conveyor_jobs WHERE state = 'available' GROUP BY queue;

-- name: expired_leases
-- Running jobs whose lease ran out, waiting for a reaper (reap's condition).
SELECT queue, count(*) AS n FROM conveyor_jobs
WHERE state = 'running' AND lease_expires_at < :now GROUP BY queue;

-- name: pause_queue
-- A row only changes if the queue was not paused: its paused_at is when the pause began.
INSERT INTO conveyor_queue_controls (queue, paused_at) VALUES (:queue, :now)
ON CONFLICT (queue) DO UPDATE SET paused_at = excluded.paused_at
WHERE conveyor_queue_controls.paused_at IS NULL;

-- name: resume_queue
UPDATE conveyor_queue_controls SET paused_at = NULL WHERE queue = :queue AND paused_at IS NOT NULL;

-- name: paused_queues
SELECT queue, paused_at FROM conveyor_queue_controls WHERE paused_at IS NOT NULL;

-- name: counters
SELECT queue, name, value FROM conveyor_counters;

-- name: record_worker
INSERT INTO conveyor_workers (id, queues, concurrency, host, pid, started_at, last_seen, running, stuck)
VALUES (:id, :queues, :concurrency, :host, :pid, :started_at, :now, :running, :stuck)
ON CONFLICT (id) DO UPDATE SET last_seen = excluded.last_seen, running = excluded.running, stuck = excluded.stuck;

-- name: remove_worker
DELETE FROM conveyor_workers WHERE id = :id;

-- name: forget_workers
DELETE FROM conveyor_workers WHERE last_seen < :before;

-- name: workers
SELECT * FROM conveyor_workers WHERE last_seen >= :since ORDER BY started_at;
