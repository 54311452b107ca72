-- Named queries of the PostgreSQL backend. :NOW is the injected time, else the
-- transaction's now(): every time comes from the database's clock.

-- name: insert
INSERT INTO conveyor_jobs (queue, task, args, state, priority, run_at, max_attempts, timeout_s,
                           unique_key, meta, created_at)
SELECT %(queue)s, %(task)s, %(args)s::jsonb,
       CASE WHEN r.run_at > t.now THEN 'scheduled' ELSE 'available' END,
       %(priority)s, r.run_at, %(max_attempts)s, %(timeout_s)s, %(unique_key)s, %(meta)s::jsonb, t.now
FROM (SELECT :NOW AS now) AS t,
     LATERAL (SELECT coalesce(to_timestamp(%(run_at)s::float8),
                              t.now + make_interval(secs => %(delay)s::float8)) AS run_at) AS r
ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND state IN ('scheduled', 'available', 'running')
DO NOTHING
RETURNING id, extract(epoch FROM created_at)::float8 AS at;

-- name: depth
SELECT count(*) AS n FROM conveyor_jobs WHERE queue = %(queue)s AND state IN ('scheduled', 'available');

-- name: find_unique
SELECT id, extract(epoch FROM :NOW)::float8 AS at FROM conveyor_jobs
WHERE unique_key = %(unique_key)s AND state IN ('scheduled', 'available', 'running');

-- name: notify
SELECT pg_notify(%(channel)s, q) FROM unnest(%(queues)s::text[]) AS q;

-- name: promote_queue
UPDATE conveyor_jobs SET state = 'available'
WHERE id IN (SELECT id FROM conveyor_jobs
             WHERE state = 'scheduled' AND queue = %(queue)s AND run_at <= :NOW
             ORDER BY run_at LIMIT %(limit)s
             FOR UPDATE SKIP LOCKED);

-- name: promote
WITH due AS MATERIALIZED (
    SELECT id FROM conveyor_jobs
    WHERE state = 'scheduled' AND run_at <= :NOW
    ORDER BY run_at LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE conveyor_jobs AS j SET state = 'available'
FROM due WHERE j.id = due.id
RETURNING j.queue;

-- name: claim
-- MATERIALIZED fences the planner so it cannot update more rows than LIMIT.
WITH picked AS MATERIALIZED (
    SELECT id FROM conveyor_jobs
    WHERE state = 'available' AND queue = %(queue)s
    ORDER BY priority, run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE conveyor_jobs AS j
SET state = 'running',
    attempt = j.attempt + 1,
    attempted_at = :NOW,
    worker_id = %(worker_id)s,
    lease_token = replace(gen_random_uuid()::text, '-', ''),
    lease_expires_at = :NOW + make_interval(secs => %(lease_s)s::float8)
FROM picked
WHERE j.id = picked.id
RETURNING j.*;

-- name: heartbeat
UPDATE conveyor_jobs AS j
SET lease_expires_at = :NOW + make_interval(secs => %(lease_s)s::float8)
FROM unnest(%(ids)s::bigint[], %(tokens)s::text[]) AS l(id, token)
WHERE j.id = l.id AND j.lease_token = l.token AND j.state = 'running' AND j.lease_expires_at >= :NOW
RETURNING j.id;

-- name: ack
UPDATE conveyor_jobs
SET state = 'succeeded', result = %(result)s::jsonb, finished_at = :NOW,
    lease_token = NULL, lease_expires_at = NULL
WHERE id = %(id)s AND lease_token = %(token)s AND state = 'running' AND lease_expires_at >= :NOW
RETURNING id;

-- name: ack_many
UPDATE conveyor_jobs AS j
SET state = 'succeeded', result = l.result::jsonb, finished_at = :NOW,
    lease_token = NULL, lease_expires_at = NULL
FROM unnest(%(ids)s::bigint[], %(tokens)s::text[], %(results)s::text[]) AS l(id, token, result)
WHERE j.id = l.id AND j.lease_token = l.token AND j.state = 'running' AND j.lease_expires_at >= :NOW
RETURNING j.id;

-- name: retry
UPDATE conveyor_jobs
SET state = CASE WHEN attempt >= max_attempts THEN 'dead'
                 WHEN %(delay)s::float8 > 0 THEN 'scheduled' ELSE 'available' END,
    run_at = CASE WHEN attempt >= max_attempts THEN run_at
                  ELSE :NOW + make_interval(secs => %(delay)s::float8) END,
    finished_at = CASE WHEN attempt >= max_attempts THEN :NOW END,
    errors = (CASE WHEN jsonb_array_length(errors) >= %(keep_errors)s THEN errors - 0 ELSE errors END)
             || jsonb_build_array(%(error)s::jsonb || jsonb_build_object(
                    'attempt', attempt, 'at', extract(epoch FROM :NOW)::float8, 'worker_id', worker_id)),
    lease_token = NULL, lease_expires_at = NULL
WHERE id = %(id)s AND lease_token = %(token)s AND state = 'running' AND lease_expires_at >= :NOW
RETURNING state, queue;

-- name: kill
UPDATE conveyor_jobs
SET state = 'dead', finished_at = :NOW,
    errors = (CASE WHEN jsonb_array_length(errors) >= %(keep_errors)s THEN errors - 0 ELSE errors END)
             || jsonb_build_array(%(error)s::jsonb || jsonb_build_object(
                    'attempt', attempt, 'at', extract(epoch FROM :NOW)::float8, 'worker_id', worker_id)),
    lease_token = NULL, lease_expires_at = NULL
WHERE id = %(id)s AND lease_token = %(token)s AND state = 'running' AND lease_expires_at >= :NOW
RETURNING id;

-- name: release
UPDATE conveyor_jobs AS j
SET state = 'available', attempt = j.attempt - 1,
    lease_token = NULL, lease_expires_at = NULL, worker_id = NULL
FROM unnest(%(ids)s::bigint[], %(tokens)s::text[]) AS l(id, token)
WHERE j.id = l.id AND j.lease_token = l.token AND j.state = 'running'
RETURNING j.id, j.queue;

-- name: reap
WITH expired AS MATERIALIZED (
    SELECT id FROM conveyor_jobs
    WHERE state = 'running' AND lease_expires_at < :NOW
    ORDER BY lease_expires_at LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE conveyor_jobs AS j
SET state = CASE WHEN j.attempt >= j.max_attempts THEN 'dead' ELSE 'available' END,
    finished_at = CASE WHEN j.attempt >= j.max_attempts THEN :NOW END,
    errors = (CASE WHEN jsonb_array_length(j.errors) >= %(keep_errors)s THEN j.errors - 0 ELSE j.errors END)
             || jsonb_build_array(jsonb_build_object(
                    'attempt', j.attempt, 'at', extract(epoch FROM :NOW)::float8, 'kind', 'lease_expired',
                    'type', 'LeaseExpired',
                    'message', 'lease expired: worker ' || coalesce(j.worker_id, '?')
                               || ' stopped heartbeating (crashed, killed or stalled)',
                    'traceback', '', 'worker_id', j.worker_id)),
    lease_token = NULL, lease_expires_at = NULL
FROM expired WHERE j.id = expired.id
RETURNING j.id, j.queue, j.state;

-- name: count_up
INSERT INTO conveyor_counters (queue, name, value)
SELECT q, %(name)s, count(*) FROM unnest(%(queues)s::text[]) AS q GROUP BY q
ON CONFLICT (queue, name) DO UPDATE SET value = conveyor_counters.value + excluded.value;

-- name: get
SELECT * FROM conveyor_jobs WHERE id = %(id)s;

-- name: redrive
-- A dead job whose unique_key a newer unfinished job holds stays dead: reviving it
-- would break uniqueness (the newer job is doing its work).
UPDATE conveyor_jobs AS j
SET state = 'available', attempt = 0, run_at = :NOW, finished_at = NULL, worker_id = NULL,
    meta = jsonb_set(j.meta, '{redriven}', to_jsonb(coalesce((j.meta ->> 'redriven')::int, 0) + 1))
WHERE j.id = %(id)s AND j.state = 'dead'
  AND (j.unique_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM conveyor_jobs AS o
        WHERE o.unique_key = j.unique_key AND o.state IN ('scheduled', 'available', 'running')))
RETURNING j.queue;

-- name: redrive_all
UPDATE conveyor_jobs AS j
SET state = 'available', attempt = 0, run_at = :NOW, finished_at = NULL, worker_id = NULL,
    meta = jsonb_set(j.meta, '{redriven}', to_jsonb(coalesce((j.meta ->> 'redriven')::int, 0) + 1))
WHERE j.state = 'dead' AND (%(queue)s::text IS NULL OR j.queue = %(queue)s) AND j.unique_key IS NULL
RETURNING j.queue;

-- name: dead_with_unique_key
SELECT id FROM conveyor_jobs
WHERE state = 'dead' AND (%(queue)s::text IS NULL OR queue = %(queue)s) AND unique_key IS NOT NULL
ORDER BY id DESC;

-- name: cancel
UPDATE conveyor_jobs
SET state = 'cancelled', finished_at = :NOW, lease_token = NULL, lease_expires_at = NULL
WHERE id = %(id)s AND state IN ('scheduled', 'available', 'running')
RETURNING id;

-- name: prune
DELETE FROM conveyor_jobs
WHERE id IN (SELECT id FROM conveyor_jobs
             WHERE state = %(state)s AND finished_at < :NOW - make_interval(secs => %(older_than)s::float8)
             ORDER BY finished_at LIMIT %(limit)s
             FOR UPDATE SKIP LOCKED);

-- name: purge
DELETE FROM conveyor_jobs
WHERE state = %(state)s AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]));

-- name: stats_now
SELECT extract(epoch FROM :NOW)::float8 AS now;

-- name: count_by_state
SELECT queue, state, count(*) AS n FROM conveyor_jobs GROUP BY queue, state;

-- name: count_unfinished
-- Reads the (state, queue, id) index for these states only: cost follows the backlog and
-- the dead-letter queue, not the retained history.
SELECT queue, state, count(*) AS n FROM conveyor_jobs
WHERE state IN ('scheduled', 'available', 'running', 'dead') GROUP BY queue, state;

-- name: due_scheduled
SELECT queue, count(*) AS n, extract(epoch FROM min(run_at))::float8 AS oldest FROM conveyor_jobs
WHERE state = 'scheduled' AND run_at <= :NOW GROUP BY queue;

-- name: oldest_available
SELECT queue, extract(epoch FROM min(run_at))::float8 AS oldest FROM conveyor_jobs
WHERE state = 'available' GROUP BY queue;

-- name: counters
SELECT queue, name, value FROM conveyor_counters;

-- name: ready
SELECT EXISTS (SELECT 1 FROM conveyor_jobs WHERE state = 'available' AND queue = ANY(%(queues)s::text[]))
    OR EXISTS (SELECT 1 FROM conveyor_jobs WHERE state = 'scheduled' AND queue = ANY(%(queues)s::text[])
               AND run_at <= now()) AS ready,
       extract(epoch FROM (SELECT min(run_at) FROM conveyor_jobs
                           WHERE state = 'scheduled' AND queue = ANY(%(queues)s::text[])) - now())::float8
           AS next_due_in;

-- name: record_worker
INSERT INTO conveyor_workers (id, queues, concurrency, host, pid, started_at, last_seen, running)
VALUES (%(id)s, %(queues)s::jsonb, %(concurrency)s, %(host)s, %(pid)s, %(started_at)s, :NOW, %(running)s)
ON CONFLICT (id) DO UPDATE SET last_seen = excluded.last_seen, running = excluded.running;

-- name: forget_workers
DELETE FROM conveyor_workers WHERE last_seen < :NOW - interval '1 day';

-- name: remove_worker
DELETE FROM conveyor_workers WHERE id = %(id)s;

-- name: workers
SELECT id, queues, concurrency, host, pid, started_at, extract(epoch FROM last_seen)::float8 AS last_seen,
       running
FROM conveyor_workers WHERE last_seen >= :NOW - make_interval(secs => %(ttl)s::float8) ORDER BY started_at;
