-- Named queries of the PostgreSQL backend. :NOW is the injected time, else the
-- transaction's now(); :STMT_NOW the injected time, else the statement's start
-- (statement_timestamp()): every time comes from the database's clock.

-- name: insert
-- fair_tag: the caller's reserved tag for a job with a fair key; else vtime + 1 of its
-- (queue, priority): the current round. A succeeded job inside its unique_for window still
-- holds the key: then nothing is inserted, no row comes back, and find_unique answers.
INSERT INTO conveyor_jobs (queue, task, args, state, priority, run_at, max_attempts, timeout_s,
                           unique_key, meta, created_at, fair_key, fair_tag, unique_for,
                           concurrency_key, concurrency_limit, rate_key, rate_limit, rate_period)
SELECT %(queue)s, %(task)s, %(args)s::json,
       CASE WHEN r.run_at > t.now THEN 'scheduled' ELSE 'available' END,
       %(priority)s, r.run_at, %(max_attempts)s, %(timeout_s)s, %(unique_key)s, %(meta)s::jsonb, t.now,
       %(fair_key)s,
       coalesce(%(fair_tag)s::bigint,
                (SELECT c.vtime + 1 FROM conveyor_queue_clock AS c
                 WHERE c.queue = %(queue)s AND c.priority = %(priority)s), 1),
       %(unique_for)s::float8,
       %(concurrency_key)s, %(concurrency_limit)s::integer, %(rate_key)s, %(rate_limit)s::integer,
       %(rate_period)s::float8
FROM (SELECT :NOW AS now) AS t,
     LATERAL (SELECT coalesce(to_timestamp(%(run_at)s::float8),
                              t.now + make_interval(secs => %(delay)s::float8)) AS run_at) AS r
WHERE %(unique_key)s::text IS NULL OR NOT EXISTS (
    SELECT 1 FROM conveyor_jobs AS d
    WHERE d.unique_key = %(unique_key)s AND d.state = 'succeeded'
      AND d.finished_at + make_interval(secs => d.unique_for) > t.now)
ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND state IN ('waiting', 'scheduled', 'available', 'running')
DO NOTHING
RETURNING id, uid, extract(epoch FROM created_at)::float8 AS at;

-- name: insert_plain
-- A batch of plain jobs (no unique key, no fair key: see _plain in postgres/enqueue.py) in one
-- statement; also a workflow write's jobs without parents (_bulk), with their batch_id and
-- has_children (a later job of the write names them). %(jobs)s is a JSON array of runs:
-- consecutive jobs that differ only in their args (a bulk enqueue's jobs all do) share one
-- array of the values of _plain_values, whose last element is the array of the run's args
-- texts. One parameter, no per-column arrays; read as jsonb,
-- parsed once (->> on json text parses the element again for every field), and a run's
-- shared values, its fair tag among them, are read once per run instead of once per job.
-- Rows go in in batch order and take ascending ids, so the ids sorted ascending pair with the
-- batch in order; they come back as one array in one row, with the batch's one created_at (a
-- row per job cost the client more than the insert of it). Each args text is a JSON string in
-- the document and comes back out byte for byte. The fair tag as in insert: vtime + 1 of the
-- round.
WITH inserted AS (
INSERT INTO conveyor_jobs (queue, task, args, state, priority, run_at, max_attempts, timeout_s,
                           meta, created_at, fair_tag, concurrency_key, concurrency_limit,
                           rate_key, rate_limit, rate_period, batch_id, has_children)
SELECT b.queue, b.task, a.args::json,
       CASE WHEN r.run_at > t.now THEN 'scheduled' ELSE 'available' END,
       b.priority, r.run_at, b.max_attempts, b.timeout_s, b.meta, t.now, b.fair_tag,
       b.concurrency_key, b.concurrency_limit, b.rate_key, b.rate_limit, b.rate_period,
       b.batch_id, b.has_children
FROM (SELECT :NOW AS now) AS t,
     LATERAL (SELECT g.ord, g.j->15 AS args_list,
                     g.j->>0 AS queue, g.j->>1 AS task,
                     (g.j->>2)::smallint AS priority, (g.j->>3)::float8 AS run_at,
                     (g.j->>4)::float8 AS delay, (g.j->>5)::integer AS max_attempts,
                     (g.j->>6)::float8 AS timeout_s, (g.j->>7)::jsonb AS meta, g.j->>8 AS concurrency_key,
                     (g.j->>9)::integer AS concurrency_limit, g.j->>10 AS rate_key,
                     (g.j->>11)::integer AS rate_limit, (g.j->>12)::float8 AS rate_period,
                     g.j->>13 AS batch_id, (g.j->>14)::boolean AS has_children,
                     coalesce((SELECT c.vtime + 1 FROM conveyor_queue_clock AS c
                               WHERE c.queue = g.j->>0 AND c.priority = (g.j->>2)::smallint), 1) AS fair_tag
              FROM jsonb_array_elements(%(jobs)s::jsonb) WITH ORDINALITY AS g(j, ord)) AS b,
     LATERAL (SELECT coalesce(to_timestamp(b.run_at),
                              t.now + make_interval(secs => b.delay)) AS run_at) AS r,
     LATERAL jsonb_array_elements_text(b.args_list) WITH ORDINALITY AS a(args, ord)
ORDER BY b.ord, a.ord
RETURNING id, uid, created_at)
SELECT array_agg(id ORDER BY id) AS ids, array_agg(uid ORDER BY id) AS uids,
       extract(epoch FROM min(created_at))::float8 AS at FROM inserted;

-- name: plain_copy_values
-- What a big batch of plain jobs needs before it is copied in (enqueue._plain_copy_plan), so
-- that each row carries what insert_plain would have written: the store's clock (as text, read
-- back by the COPY in this session exactly), per run of %(runs)s ([queue, priority, run_at,
-- delay], as in insert_plain's document) its state, run_at and fair tag, and %(n)s ids taken
-- from the jobs' own identity sequence, ascending (COPY returns nothing, hence the ids up
-- front; the ids a failed batch took are skipped, as a failed insert's are). The sequence is
-- looked up once (a subquery run once), not once per id.
WITH t AS (SELECT :NOW AS now),
runs AS (
    SELECT g.ord, r.run_at,
           coalesce((SELECT c.vtime + 1 FROM conveyor_queue_clock AS c
                     WHERE c.queue = g.j->>0 AND c.priority = (g.j->>1)::smallint), 1) AS fair_tag
    FROM t, jsonb_array_elements(%(runs)s::jsonb) WITH ORDINALITY AS g(j, ord),
         LATERAL (SELECT coalesce(to_timestamp((g.j->>2)::float8),
                                  t.now + make_interval(secs => (g.j->>3)::float8)) AS run_at) AS r
)
SELECT (SELECT array_agg(v.id ORDER BY v.id)
        FROM (SELECT nextval((SELECT pg_get_serial_sequence('conveyor_jobs', 'id'))::regclass)
              AS id FROM generate_series(1, %(n)s::integer)) AS v) AS ids,
       t.now::text AS created_at, extract(epoch FROM t.now)::float8 AS at,
       (SELECT array_agg(CASE WHEN runs.run_at > t.now THEN 'scheduled' ELSE 'available' END
                         ORDER BY runs.ord) FROM runs) AS states,
       (SELECT array_agg(runs.run_at::text ORDER BY runs.ord) FROM runs) AS run_ats,
       (SELECT array_agg(runs.fair_tag ORDER BY runs.ord) FROM runs) AS fair_tags
FROM t;

-- name: unique_held
-- Which of these keys a job holds now: an unfinished one, or a succeeded one in its window.
SELECT DISTINCT unique_key FROM conveyor_jobs
WHERE unique_key = ANY(%(keys)s::text[])
  AND (state IN ('waiting', 'scheduled', 'available', 'running')
       OR (state = 'succeeded' AND finished_at + make_interval(secs => unique_for) > :NOW));

-- name: take_fair_tags
-- Reserves n consecutive tags per (queue, priority, fair key): max(last_tag, vtime) + 1 .. + n.
-- Rows are upserted in key order, so concurrent batches lock them in one order (no deadlock),
-- and the row lock serialises concurrent enqueues of one key: the later one starts after the
-- earlier one's last tag.
WITH b AS (
    SELECT * FROM unnest(%(queues)s::text[], %(priorities)s::smallint[], %(keys)s::text[], %(counts)s::bigint[])
        AS b(queue, priority, fair_key, n)
)
INSERT INTO conveyor_fair_tags AS f (queue, priority, fair_key, last_tag)
SELECT b.queue, b.priority, b.fair_key, coalesce(c.vtime, 0) + b.n
FROM b LEFT JOIN conveyor_queue_clock AS c ON c.queue = b.queue AND c.priority = b.priority
ORDER BY b.queue, b.priority, b.fair_key
ON CONFLICT (queue, priority, fair_key) DO UPDATE
SET last_tag = greatest(f.last_tag + (SELECT b.n FROM b WHERE b.queue = excluded.queue
                                                          AND b.priority = excluded.priority
                                                          AND b.fair_key = excluded.fair_key),
                        excluded.last_tag)
RETURNING queue, priority, fair_key, last_tag;

-- name: depth
SELECT count(*) AS n FROM conveyor_jobs WHERE queue = %(queue)s AND state IN ('scheduled', 'available');

-- name: find_unique
-- The job holding the key: the unfinished one, else the latest succeeded one in its window.
(SELECT id, extract(epoch FROM :NOW)::float8 AS at FROM conveyor_jobs
 WHERE unique_key = %(unique_key)s AND state IN ('waiting', 'scheduled', 'available', 'running'))
UNION ALL
(SELECT id, extract(epoch FROM :NOW)::float8 AS at FROM conveyor_jobs
 WHERE unique_key = %(unique_key)s AND state = 'succeeded'
   AND finished_at + make_interval(secs => unique_for) > :NOW
 ORDER BY finished_at DESC LIMIT 1)
LIMIT 1;

-- name: notify
SELECT pg_notify(%(channel)s, q) FROM unnest(%(queues)s::text[]) AS q;

-- name: promote_queue
UPDATE conveyor_jobs SET state = 'available'
WHERE id IN (SELECT id FROM conveyor_jobs
             WHERE state = 'scheduled' AND queue = %(queue)s AND run_at <= :NOW
             ORDER BY run_at LIMIT %(limit)s
             FOR NO KEY UPDATE SKIP LOCKED);

-- name: promote
WITH due AS MATERIALIZED (
    SELECT id FROM conveyor_jobs
    WHERE state = 'scheduled' AND run_at <= :NOW
    ORDER BY run_at LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE conveyor_jobs AS j SET state = 'available'
FROM due WHERE j.id = due.id
RETURNING j.queue;

-- name: claim_candidates
-- The limited path's walk: waiting jobs in claim order, read without locks (locking every job
-- looked at would write each one); claim_ids locks and re-checks the chosen ones.
SELECT id, priority, fair_tag, run_at, concurrency_key, concurrency_limit, rate_key, rate_limit, rate_period
FROM conveyor_jobs
WHERE state = 'available' AND queue = %(queue)s
  AND NOT EXISTS (SELECT 1 FROM conveyor_queue_controls AS c
                  WHERE c.queue = %(queue)s AND c.paused_at IS NOT NULL)
ORDER BY priority, fair_tag, run_at, id
LIMIT %(limit)s;

-- name: claim_candidates_after
-- The next page of the walk, after the last job of the previous one (keyset: no OFFSET).
SELECT id, priority, fair_tag, run_at, concurrency_key, concurrency_limit, rate_key, rate_limit, rate_period
FROM conveyor_jobs
WHERE state = 'available' AND queue = %(queue)s
  AND NOT EXISTS (SELECT 1 FROM conveyor_queue_controls AS c
                  WHERE c.queue = %(queue)s AND c.paused_at IS NOT NULL)
  AND (priority, fair_tag, run_at, id) > (%(priority)s::smallint, %(fair_tag)s::bigint,
                                          %(run_at)s::timestamptz, %(id)s::bigint)
ORDER BY priority, fair_tag, run_at, id
LIMIT %(limit)s;

-- name: limit_locks
-- One transaction-scoped advisory lock per limit key: claimers of one key take turns, so none
-- counts a limit while another is about to exceed it. Two-int form, (namespace, hash): its own
-- lock space, apart from the one-bigint locks (migrations, max_depth). 1668247139 ('conc') for
-- concurrency keys, 1918989413 ('rate') for rate keys; the schema is hashed in so stores in
-- other schemas of the database do not contend. Try, never wait: a key another claimer holds
-- is passed over this round (no waiting, no deadlock), and the holder claims its jobs.
SELECT k.kind, k.key,
       pg_try_advisory_xact_lock(CASE k.kind WHEN 'c' THEN 1668247139 ELSE 1918989413 END,
                                 hashtext(current_schema() || ':' || k.key)) AS locked
FROM unnest(%(kinds)s::text[], %(keys)s::text[]) AS k(kind, key);

-- name: limit_counts
-- Run after limit_locks, in a statement of its own: READ COMMITTED takes a fresh snapshot,
-- which sees the commit of the key's previous holder. Running jobs per concurrency key, and
-- claims per rate key within (t - period, t], where t is this statement's time (not the
-- transaction's, which is older than the lock). Every claim was recorded at its attempt's
-- start (claim_ids), before its commit and so before t; this claim's attempts start after t.
-- So a claim left out of the count started at least a period before any this claim admits:
-- starts, not counts, are what the limit bounds, whatever the time between the statements.
SELECT 'c' AS kind, c.key, NULL::float8 AS period,
       (SELECT count(*) FROM conveyor_jobs AS j
        WHERE j.state = 'running' AND j.concurrency_key = c.key) AS n
FROM unnest(%(ckeys)s::text[]) AS c(key)
UNION ALL
SELECT 'r', w.key, w.period,
       (SELECT count(*) FROM conveyor_rate_claims AS r
        WHERE r.rate_key = w.key AND r.at > t.at - make_interval(secs => w.period))
FROM unnest(%(rkeys)s::text[], %(periods)s::float8[]) AS w(key, period),
     (SELECT :STMT_NOW AS at) AS t;

-- name: claim_ids
-- The limited path's claim of the jobs it chose: as the claim statement, for these ids. SKIP
-- LOCKED and the state re-checked under the lock: a job another claimer took meanwhile is left
-- out (never waited for). Each claimed rate-limited job records its claim at its attempt's
-- start, in the same statement (see limit_counts). Its attempt starts at this statement's
-- time, after the key locks were taken: after the ack of the job whose slot it takes.
WITH picked AS MATERIALIZED (
    SELECT id FROM conveyor_jobs
    WHERE id = ANY(%(ids)s::bigint[]) AND state = 'available'
      AND NOT EXISTS (SELECT 1 FROM conveyor_queue_controls AS c
                      WHERE c.queue = %(queue)s AND c.paused_at IS NOT NULL)
    FOR NO KEY UPDATE SKIP LOCKED
), claimed AS (
    UPDATE conveyor_jobs AS j
    SET state = 'running',
        attempt = j.attempt + 1,
        attempted_at = :STMT_NOW,
        worker_id = %(worker_id)s,
        lease_token = %(claim_id)s || j.id::text,
        lease_expires_at = :STMT_NOW + make_interval(secs => %(lease_s)s::float8),
        held = j.id = ANY(%(held_ids)s::bigint[])
    FROM picked
    WHERE j.id = picked.id
    RETURNING :JOB(j)
), rated AS (
    INSERT INTO conveyor_rate_claims (rate_key, at, expires_at, job_id)
    SELECT r.rate_key, r.attempted_at, r.attempted_at + make_interval(secs => r.rate_period), r.id
    FROM claimed AS r
    WHERE r.rate_key IS NOT NULL
), tops AS MATERIALIZED (
    SELECT priority, max(fair_tag) AS tag FROM claimed GROUP BY priority
), raised AS (
    INSERT INTO conveyor_queue_clock AS c (queue, priority, vtime)
    SELECT %(queue)s, t.priority, t.tag FROM tops AS t
    WHERE NOT EXISTS (SELECT 1 FROM conveyor_queue_clock AS o
                      WHERE o.queue = %(queue)s AND o.priority = t.priority AND o.vtime >= t.tag)
    ORDER BY t.priority
    ON CONFLICT (queue, priority) DO UPDATE SET vtime = excluded.vtime WHERE c.vtime < excluded.vtime
)
SELECT claimed.*,
       (SELECT coalesce(json_object_agg(s.step, s.result), '{}'::json)
        FROM conveyor_steps AS s WHERE s.job_id = claimed.id) AS steps
FROM claimed;

-- name: take_lock
-- The job's state before a take (locked, so the take that follows sees the same).
SELECT state FROM conveyor_jobs WHERE id = %(id)s FOR NO KEY UPDATE;

-- name: raise_clock
-- A taken job's round is done, as a claimed one's (claim_ids' "raised").
INSERT INTO conveyor_queue_clock AS c (queue, priority, vtime)
VALUES (%(queue)s, %(priority)s, %(tag)s)
ON CONFLICT (queue, priority) DO UPDATE SET vtime = excluded.vtime WHERE c.vtime < excluded.vtime;

-- name: take
-- A broker's delivery (Backend.take): the job by id, whatever its run_at and whatever lease it
-- held. A lease it held was lost (the broker handed the message out again): recorded as reap
-- records an expiry, and if that was its last attempt the job goes dead instead (spent; the
-- row trigger settles its children, as for reap). SET reads the row as it was.
-- A live lease given for a delivery of this same message is left alone (Backend.take).
WITH taken AS (
    UPDATE conveyor_jobs AS j
    SET errors = CASE WHEN j.state = 'running' THEN
                     (CASE WHEN jsonb_array_length(j.errors) >= %(keep_errors)s
                           THEN j.errors - 0 ELSE j.errors END)
                     || jsonb_build_array(jsonb_build_object(
                            'attempt', j.attempt, 'at', extract(epoch FROM :NOW)::float8,
                            'kind', 'lease_expired', 'type', 'LeaseExpired',
                            'message', 'the broker handed the job out again: worker '
                                       || coalesce(j.worker_id, '?') || ' stopped answering'
                                       || CASE WHEN j.attempt >= j.max_attempts
                                               THEN '; no attempts left' ELSE '' END,
                            'traceback', '', 'worker_id', j.worker_id))
                 ELSE j.errors END,
        state = CASE WHEN j.state = 'running' AND j.attempt >= j.max_attempts THEN 'dead'
                     ELSE 'running' END,
        finished_at = CASE WHEN j.state = 'running' AND j.attempt >= j.max_attempts
                           THEN :NOW END,
        attempt = CASE WHEN j.state = 'running' AND j.attempt >= j.max_attempts
                       THEN j.attempt ELSE j.attempt + 1 END,
        attempted_at = CASE WHEN j.state = 'running' AND j.attempt >= j.max_attempts
                            THEN j.attempted_at ELSE :NOW END,
        worker_id = CASE WHEN j.state = 'running' AND j.attempt >= j.max_attempts
                         THEN j.worker_id ELSE %(worker_id)s END,
        lease_token = CASE WHEN j.state = 'running' AND j.attempt >= j.max_attempts
                           THEN NULL ELSE %(token)s END,
        lease_expires_at = CASE WHEN j.state = 'running' AND j.attempt >= j.max_attempts
                                THEN NULL
                                ELSE :NOW + make_interval(secs => %(lease_s)s::float8) END,
        held = false
    WHERE j.id = %(id)s AND j.state IN ('available', 'scheduled', 'running')
      -- Not a live lease given for this very message (Backend.take's ``message``).
      AND NOT (j.state = 'running' AND j.lease_expires_at > :NOW
               AND %(message)s::text IS NOT NULL
               AND right(j.lease_token, length(%(message)s::text)) = %(message)s::text)
    RETURNING :JOB(j),
              CASE WHEN j.waited AND j.state = 'dead'
                   THEN pg_notify('conveyor_done', j.id::text) END AS told
)
SELECT taken.*,
       (SELECT coalesce(json_object_agg(s.step, s.result), '{}'::json)
        FROM conveyor_steps AS s WHERE s.job_id = taken.id) AS steps
FROM taken;

-- name: heartbeat
-- The leases still held: the ones renewed, and the ones another transaction is writing right
-- now whose last committed version still shows our valid lease. Those are passed over (SKIP
-- LOCKED), never waited for, so a heartbeat neither queues behind a long transaction nor takes
-- part in a deadlock. Counting them as held is safe: the writer is our own ack (ack_many, a
-- claim's acks, or transaction() committing the job: the job is finishing, and if that write
-- rolls back the lease still runs until its time and the next heartbeat renews it), a cancel
-- or a reaper (the next heartbeat finds the job gone from us), or a claimer locking the row
-- for an instant before its state re-check passes it by. A lease counted held a heartbeat
-- too long costs at most one interval of running on; every write of an outcome stays fenced
-- by the lease token. Locks are taken in id order, as by every multi-row write here.
WITH mine AS MATERIALIZED (
    SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::text[]) AS l(id, token)
), locked AS MATERIALIZED (
    -- A lookup per id, in id order, as in ack_many.
    :LOCKED_IDS(FOR NO KEY UPDATE SKIP LOCKED)
), renewed AS (
    UPDATE conveyor_jobs AS j
    SET lease_expires_at = :NOW + make_interval(secs => %(lease_s)s::float8),
        held = j.held AND j.id = ANY(%(held)s::bigint[])
    FROM locked, mine
    WHERE j.id = locked.id AND j.id = mine.id AND j.lease_token = mine.token AND j.state = 'running'
      AND j.lease_expires_at >= :NOW
    RETURNING j.id
)
SELECT id FROM renewed
UNION ALL
SELECT j.id FROM mine CROSS JOIN LATERAL (
    SELECT id FROM conveyor_jobs
    WHERE id = mine.id AND lease_token = mine.token AND state = 'running'
      AND lease_expires_at >= :NOW) AS j
WHERE j.id NOT IN (SELECT id FROM locked);

-- name: ack
UPDATE conveyor_jobs
SET state = 'succeeded', result = %(result)s::json, finished_at = :NOW,
    lease_token = NULL, lease_expires_at = NULL
WHERE id = %(id)s AND lease_token = %(token)s AND state = 'running' AND lease_expires_at >= :NOW
RETURNING id, queue, concurrency_key, CASE WHEN waited THEN pg_notify('conveyor_done', id::text) END AS told;

-- name: ack_many
-- Rows are locked first, in id order (an UPDATE ... FROM unnest locks them in the order of the
-- array, the order the jobs finished in): two writes over the same jobs in different orders,
-- this and a release or an older heartbeat, would otherwise deadlock. NO KEY UPDATE, as the
-- UPDATE itself takes: it does not wait for a step record's key-share lock.
-- Each row is locked by a lookup of its own id (:LOCKED_IDS, queries.py: a LATERAL nested
-- loop over the sorted ids, so locks are taken in id order), never by one scan for all the
-- ids: a plan made while the table was near-empty (psycopg prepares a statement, and
-- PostgreSQL keeps that generic plan until an ANALYZE) would read the whole table for
-- "id = ANY(ids)", however large it has grown since. A lookup per id is the cheapest plan at
-- any size. The same in every statement below that takes rows by an array of ids.
WITH locked AS MATERIALIZED (
    :LOCKED_IDS(FOR NO KEY UPDATE)
)
UPDATE conveyor_jobs AS j
SET state = 'succeeded', result = l.result::json, finished_at = :NOW,
    lease_token = NULL, lease_expires_at = NULL
FROM locked, unnest(%(ids)s::bigint[], %(tokens)s::text[], %(results)s::text[]) AS l(id, token, result)
WHERE j.id = locked.id AND j.id = l.id AND j.lease_token = l.token AND j.state = 'running'
  AND j.lease_expires_at >= :NOW
RETURNING j.id, j.queue, j.concurrency_key, CASE WHEN j.waited THEN pg_notify('conveyor_done', j.id::text) END AS told;

-- name: ack_claim
-- What a worker runs (and Backend.claim, with no acks: empty arrays): ack_many in front (a
-- worker's finished jobs and its next claim in one round trip), then the claim, and the acked
-- jobs as a column of every row (the claim always returns at least one row): acked, a JSON
-- array of {id, concurrency_key, queue}. Acked jobs are running, never candidates of the
-- claim. Keep the ack part in step with ack_many.
-- The claim, the fast path: pick, lease, and raise the vtime of each (queue, priority) it
-- claimed at to the largest tag it handed out there. MATERIALIZED fences the planner so it
-- cannot update more rows than LIMIT. A clock row is only touched when this claim moves it
-- forward as the statement's snapshot sees it (the usual claim, within the current round,
-- takes no lock on it); then the upsert locks it (in priority order: no deadlock between
-- claims), re-checks against the latest committed vtime, and inserts the row on a first claim.
-- If any picked job has a concurrency or rate key, nothing is claimed: the statement returns
-- one row of NULLs with head_limited true, and the caller takes the limited path
-- (claim_candidates ... claim_ids). Otherwise rows come back unordered, head_limited false (a
-- queue with nothing to claim gives one row of NULLs): the caller sorts them into claim order.
-- Lease tokens are the caller's claim id and the job's id (see Backend.claim); the jobs after
-- the first %(start)s in claim order are held (a worker's prefetch), not started. (A window
-- function cannot share a SELECT with FOR UPDATE: the rank is a CTE of its own.)
-- A paused queue (conveyor_queue_controls) is picked from not at all, as in every claim
-- statement here (claim_candidates, claim_candidates_after, claim_ids): the acks still land.
WITH acked AS (
    WITH locked AS MATERIALIZED (
        :LOCKED_IDS(FOR NO KEY UPDATE)
    )
    UPDATE conveyor_jobs AS j
    SET state = 'succeeded', result = l.result::json, finished_at = :NOW,
        lease_token = NULL, lease_expires_at = NULL
    FROM locked,
         unnest(%(ids)s::bigint[], %(tokens)s::text[], %(results)s::text[]) AS l(id, token, result)
    WHERE j.id = locked.id AND j.id = l.id AND j.lease_token = l.token AND j.state = 'running'
      AND j.lease_expires_at >= :NOW
    RETURNING j.id, j.queue, j.concurrency_key, CASE WHEN j.waited THEN pg_notify('conveyor_done', j.id::text) END AS told
), picked AS MATERIALIZED (
    SELECT id, priority, fair_tag, run_at, concurrency_key IS NOT NULL OR rate_key IS NOT NULL AS limited
    FROM conveyor_jobs
    WHERE state = 'available' AND queue = %(queue)s
      AND NOT EXISTS (SELECT 1 FROM conveyor_queue_controls AS c
                      WHERE c.queue = %(queue)s AND c.paused_at IS NOT NULL)
    ORDER BY priority, fair_tag, run_at, id
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), head AS MATERIALIZED (
    SELECT coalesce(bool_or(limited), false) AS limited FROM picked
), ranked AS MATERIALIZED (
    SELECT id, row_number() OVER (ORDER BY priority, fair_tag, run_at, id) AS n FROM picked
), claimed AS (
    UPDATE conveyor_jobs AS j
    SET state = 'running',
        attempt = j.attempt + 1,
        attempted_at = :NOW,
        worker_id = %(worker_id)s,
        lease_token = %(claim_id)s || j.id::text,
        lease_expires_at = :NOW + make_interval(secs => %(lease_s)s::float8),
        held = ranked.n > %(start)s
    FROM ranked
    WHERE j.id = ranked.id AND NOT (SELECT h.limited FROM head AS h)
    RETURNING :JOB(j)
), tops AS MATERIALIZED (
    SELECT priority, max(fair_tag) AS tag FROM claimed GROUP BY priority
), raised AS (
    INSERT INTO conveyor_queue_clock AS c (queue, priority, vtime)
    SELECT %(queue)s, t.priority, t.tag FROM tops AS t
    WHERE NOT EXISTS (SELECT 1 FROM conveyor_queue_clock AS o
                      WHERE o.queue = %(queue)s AND o.priority = t.priority AND o.vtime >= t.tag)
    ORDER BY t.priority
    ON CONFLICT (queue, priority) DO UPDATE SET vtime = excluded.vtime WHERE c.vtime < excluded.vtime
)
SELECT (SELECT coalesce(json_agg(json_build_object('id', a.id, 'concurrency_key', a.concurrency_key,
                                                   'queue', a.queue)), '[]')
        FROM acked AS a) AS acked,
       claimed.*,
       (SELECT coalesce(json_object_agg(s.step, s.result), '{}'::json)
        FROM conveyor_steps AS s WHERE s.job_id = claimed.id) AS steps,
       head.limited AS head_limited
FROM head LEFT JOIN claimed ON true;

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
RETURNING state, queue, concurrency_key,
          CASE WHEN waited AND state = 'dead' THEN pg_notify('conveyor_done', id::text) END AS told;

-- name: kill
UPDATE conveyor_jobs
SET state = 'dead', finished_at = :NOW,
    errors = (CASE WHEN jsonb_array_length(errors) >= %(keep_errors)s THEN errors - 0 ELSE errors END)
             || jsonb_build_array(%(error)s::jsonb || jsonb_build_object(
                    'attempt', attempt, 'at', extract(epoch FROM :NOW)::float8, 'worker_id', worker_id)),
    lease_token = NULL, lease_expires_at = NULL
WHERE id = %(id)s AND lease_token = %(token)s AND state = 'running' AND lease_expires_at >= :NOW
RETURNING id, queue, concurrency_key, CASE WHEN waited THEN pg_notify('conveyor_done', id::text) END AS told;

-- name: release
-- Rows locked in id order first, a lookup per id, as in ack_many.
WITH locked AS MATERIALIZED (
    :LOCKED_IDS(FOR NO KEY UPDATE)
)
UPDATE conveyor_jobs AS j
SET state = 'available', attempt = j.attempt - 1,
    lease_token = NULL, lease_expires_at = NULL, worker_id = NULL
FROM locked, unnest(%(ids)s::bigint[], %(tokens)s::text[]) AS l(id, token)
WHERE j.id = locked.id AND j.id = l.id AND j.lease_token = l.token AND j.state = 'running'
RETURNING j.id, j.queue;

-- name: release_claim
-- A claim whose reply was lost: its jobs back unrun, found by the claim id their tokens begin
-- with (a rare path: it reads the queue's running jobs). Rows locked in id order, as in release.
WITH locked AS MATERIALIZED (
    SELECT id FROM conveyor_jobs
    WHERE state = 'running' AND queue = %(queue)s AND left(lease_token, 24) = %(claim_id)s
    ORDER BY id
    FOR NO KEY UPDATE
)
UPDATE conveyor_jobs AS j
SET state = 'available', attempt = j.attempt - 1,
    lease_token = NULL, lease_expires_at = NULL, worker_id = NULL
FROM locked
WHERE j.id = locked.id AND j.state = 'running' AND left(j.lease_token, 24) = %(claim_id)s
RETURNING j.id, j.queue;

-- name: reap
-- A job claimed held that never started (see backends/base.py) goes back uncounted, as a
-- stall, while it has stalled fewer than max_stalls times; past that its expiry counts.
WITH expired AS MATERIALIZED (
    SELECT id, held AND stalls < %(max_stalls)s AS free FROM conveyor_jobs
    WHERE state = 'running' AND lease_expires_at < :NOW
    ORDER BY lease_expires_at LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE conveyor_jobs AS j
SET state = CASE WHEN e.free THEN 'available' WHEN j.attempt >= j.max_attempts THEN 'dead' ELSE 'available' END,
    finished_at = CASE WHEN NOT e.free AND j.attempt >= j.max_attempts THEN :NOW END,
    attempt = CASE WHEN e.free THEN j.attempt - 1 ELSE j.attempt END,
    stalls = CASE WHEN e.free THEN j.stalls + 1 ELSE j.stalls END,
    errors = (CASE WHEN jsonb_array_length(j.errors) >= %(keep_errors)s THEN j.errors - 0 ELSE j.errors END)
             || jsonb_build_array(jsonb_build_object(
                    'attempt', j.attempt, 'at', extract(epoch FROM :NOW)::float8, 'kind', 'lease_expired', 'type', 'LeaseExpired',
                    'message', CASE
                        WHEN NOT j.held THEN 'lease expired mid-job: worker ' || coalesce(j.worker_id, '?')
                             || ' stopped heartbeating (crashed, killed or stalled)'
                        WHEN e.free THEN 'lease expired before the job started (as far as the store'
                             || ' knows): worker ' || coalesce(j.worker_id, '?') || ' held it (prefetched, or the'
                             || ' reply to its claim was lost) and stopped heartbeating; attempt not counted'
                        ELSE 'lease expired before the job started, ' || (j.stalls + 1)
                             || ' times: counted as an attempt; worker ' || coalesce(j.worker_id, '?')
                             || ' stopped heartbeating' END,
                    'traceback', '', 'worker_id', j.worker_id)),
    lease_token = NULL, lease_expires_at = NULL, held = false
FROM expired AS e WHERE j.id = e.id
RETURNING j.id, j.queue, j.state, j.concurrency_key,
          CASE WHEN j.waited AND j.state = 'dead' THEN pg_notify('conveyor_done', j.id::text) END AS told;

-- name: count_up
-- Counter rows upserted in queue order: concurrent reapers lock them in one order.
INSERT INTO conveyor_counters (queue, name, value)
SELECT q, %(name)s, count(*) FROM unnest(%(queues)s::text[]) AS q GROUP BY q ORDER BY q
ON CONFLICT (queue, name) DO UPDATE SET value = conveyor_counters.value + excluded.value;

-- name: job_rows
-- Jobs with their step records; list_jobs adds its WHERE and ORDER BY.
SELECT :JOB(j),
       (SELECT coalesce(json_object_agg(s.step, s.result), '{}'::json)
        FROM conveyor_steps AS s WHERE s.job_id = j.id) AS steps
FROM conveyor_jobs AS j;

-- name: mark_waited
-- job.wait: the finishing statements notify conveyor_done for this job (see 009_job_waited.sql).
UPDATE conveyor_jobs SET waited = true WHERE id = %(id)s AND NOT waited;

-- name: get
SELECT :JOB(j),
       (SELECT coalesce(json_object_agg(s.step, s.result), '{}'::json)
        FROM conveyor_steps AS s WHERE s.job_id = j.id) AS steps
FROM conveyor_jobs AS j WHERE j.id = %(id)s;

-- name: redrive
-- A dead job whose unique_key a newer unfinished job holds stays dead: reviving it
-- would break uniqueness (the newer job is doing its work).
UPDATE conveyor_jobs AS j
SET state = 'available', attempt = 0, run_at = :NOW, finished_at = NULL, worker_id = NULL,
    meta = jsonb_set(j.meta, '{redriven}', to_jsonb(coalesce((j.meta ->> 'redriven')::int, 0) + 1))
WHERE j.id = %(id)s AND j.state = 'dead'
  AND (j.unique_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM conveyor_jobs AS o
        WHERE o.unique_key = j.unique_key AND o.state IN ('waiting', 'scheduled', 'available', 'running')))
RETURNING j.id, j.queue, j.priority, j.fair_key;

-- name: redrive_all
UPDATE conveyor_jobs AS j
SET state = 'available', attempt = 0, run_at = :NOW, finished_at = NULL, worker_id = NULL,
    meta = jsonb_set(j.meta, '{redriven}', to_jsonb(coalesce((j.meta ->> 'redriven')::int, 0) + 1))
WHERE j.state = 'dead' AND (%(queue)s::text IS NULL OR j.queue = %(queue)s) AND j.unique_key IS NULL
RETURNING j.id, j.queue, j.priority, j.fair_key;

-- name: retag
-- Redriven jobs join the current round as new jobs do: the reserved tag of a job with a fair
-- key, else vtime + 1 of its (queue, priority).
UPDATE conveyor_jobs AS j
SET fair_tag = coalesce(v.tag, (SELECT c.vtime + 1 FROM conveyor_queue_clock AS c
                                WHERE c.queue = j.queue AND c.priority = j.priority), 1)
FROM unnest(%(ids)s::bigint[], %(tags)s::bigint[]) AS v(id, tag)
WHERE j.id = v.id;

-- name: dead_with_unique_key
SELECT id FROM conveyor_jobs
WHERE state = 'dead' AND (%(queue)s::text IS NULL OR queue = %(queue)s) AND unique_key IS NOT NULL
ORDER BY id DESC;

-- name: cancel
-- Locks the row first to read the state it leaves: a running job with a concurrency key frees
-- a slot, and the caller wakes idle workers for the jobs it held back. NO KEY UPDATE, as every
-- row lock here that precedes an update (no key changes): it does not wait for the key-share
-- lock a step recorded inside the task's open transaction() holds on the job.
WITH old AS (
    SELECT id, state FROM conveyor_jobs
    WHERE id = %(id)s AND state IN ('waiting', 'scheduled', 'available', 'running')
    FOR NO KEY UPDATE
)
UPDATE conveyor_jobs AS j
SET state = 'cancelled', finished_at = :NOW, lease_token = NULL, lease_expires_at = NULL
FROM old WHERE j.id = old.id
RETURNING j.id, j.queue, j.concurrency_key, old.state AS was,
          CASE WHEN j.waited THEN pg_notify('conveyor_done', j.id::text) END AS told;

-- name: cancel_many
-- cancel for many ids in one statement, rows locked in id order as every multi-row write
-- here locks. The settle trigger fires for each cancelled row at the end of the statement, so
-- a child named here is cancelled by the statement itself before its parent's cascade runs.
WITH old AS MATERIALIZED (
    SELECT id, state FROM conveyor_jobs
    WHERE id = ANY(%(ids)s::bigint[]) AND state IN ('waiting', 'scheduled', 'available', 'running')
    ORDER BY id
    FOR NO KEY UPDATE
)
UPDATE conveyor_jobs AS j
SET state = 'cancelled', finished_at = :NOW, lease_token = NULL, lease_expires_at = NULL
FROM old WHERE j.id = old.id
RETURNING j.id, j.queue, j.concurrency_key, old.state AS was,
          CASE WHEN j.waited THEN pg_notify('conveyor_done', j.id::text) END AS told;

-- name: prune
-- A job with an unfinished child stays (the child may read its result); only a job some job
-- was enqueued after (has_children) pays for that check. The deleted jobs' edges go with them
-- (no foreign keys: see 010_workflows.sql), and the batches they named come back for
-- prune_batches.
WITH gone AS (
    DELETE FROM conveyor_jobs
    WHERE id IN (SELECT j.id FROM conveyor_jobs AS j
                 WHERE j.state = %(state)s
                   AND j.finished_at < :NOW - make_interval(secs => %(older_than)s::float8)
                   AND (NOT j.has_children OR NOT EXISTS (
                        SELECT 1 FROM conveyor_edges AS e JOIN conveyor_jobs AS c ON c.id = e.child_id
                        WHERE e.parent_id = j.id
                          AND c.state IN ('waiting', 'scheduled', 'available', 'running')))
                 ORDER BY j.finished_at LIMIT %(limit)s
                 FOR UPDATE SKIP LOCKED)
    RETURNING id, has_children, parents, batch_id, callback_of
:FORGET_GONE;

-- name: forget_gone
-- Not a statement: the end of prune and purge (written in for :FORGET_GONE by queries.py).
-- The deleted jobs (the CTE "gone") take their edges with them (no foreign keys: see
-- 010_workflows.sql), and the batches they named come back for prune_batches.
), as_parent AS (
    DELETE FROM conveyor_edges WHERE parent_id IN (SELECT id FROM gone WHERE has_children)
), as_child AS (
    DELETE FROM conveyor_edges AS e
    USING (SELECT g.id, p.id AS parent_id FROM gone AS g, unnest(g.parents) AS p(id)) AS x
    WHERE e.parent_id = x.parent_id AND e.child_id = x.id
)
SELECT (SELECT count(*) FROM gone) AS n,
       ARRAY(SELECT DISTINCT b FROM gone, LATERAL (VALUES (batch_id), (callback_of)) AS v(b)
             WHERE b IS NOT NULL) AS batches

-- name: prune_batches
-- Batch records whose last member, callback and nested batch are gone; their enclosing
-- batches are asked next.
DELETE FROM conveyor_batches AS b
WHERE b.id = ANY(%(ids)s::text[])
  AND NOT EXISTS (SELECT 1 FROM conveyor_jobs AS j WHERE j.batch_id = b.id)
  AND NOT EXISTS (SELECT 1 FROM conveyor_jobs AS j WHERE j.callback_of = b.id)
  AND NOT EXISTS (SELECT 1 FROM conveyor_batches AS c WHERE c.parent_id = b.id)
RETURNING b.parent_id;

-- name: prune_fair_tags
-- A fair key whose last tag is at or below its round's vtime starts from vtime anyway: its
-- row means nothing. SKIP LOCKED: a row an enqueue is using right now is left for next time.
DELETE FROM conveyor_fair_tags AS f
USING (SELECT t.queue, t.priority, t.fair_key FROM conveyor_fair_tags AS t
       JOIN conveyor_queue_clock AS c ON c.queue = t.queue AND c.priority = t.priority
       WHERE t.last_tag <= c.vtime
       LIMIT %(limit)s
       FOR UPDATE OF t SKIP LOCKED) AS old
WHERE f.queue = old.queue AND f.priority = old.priority AND f.fair_key = old.fair_key;

-- name: prune_rate_claims
-- Claims of rate-limited jobs whose window has passed count for nothing.
DELETE FROM conveyor_rate_claims
WHERE id IN (SELECT id FROM conveyor_rate_claims WHERE expires_at < :NOW
             ORDER BY expires_at LIMIT %(limit)s
             FOR UPDATE SKIP LOCKED);

-- name: cron_take
-- Compare-and-set of a schedule's last tick: a row changes (and comes back) only for a newer
-- tick. Racing schedulers queue on the row lock; the losers then see the winner's tick.
-- The row that comes back (the row as written, under its lock) says whether the tick may make a
-- job: not while the schedule is disabled, nor for a tick from before it was enabled again.
INSERT INTO conveyor_cron AS c (name, last_tick, updated_at) VALUES (%(name)s, %(tick)s, :NOW)
ON CONFLICT (name) DO UPDATE SET last_tick = excluded.last_tick, updated_at = excluded.updated_at
WHERE c.last_tick < excluded.last_tick
RETURNING c.disabled_at IS NULL AND (c.enabled_at IS NULL OR c.enabled_at <= %(tick)s) AS runs;

-- name: cron_last_job
UPDATE conveyor_cron SET last_job_id = %(id)s WHERE name = %(name)s;

-- name: cron_disable
-- A schedule no scheduler has seen starts at now, as a first sight records its latest tick.
INSERT INTO conveyor_cron AS c (name, last_tick, updated_at, disabled_at)
VALUES (%(name)s, extract(epoch FROM :NOW)::float8, :NOW, extract(epoch FROM :NOW)::float8)
ON CONFLICT (name) DO UPDATE SET disabled_at = excluded.disabled_at, updated_at = excluded.updated_at
WHERE c.disabled_at IS NULL
RETURNING c.name;

-- name: cron_enable
UPDATE conveyor_cron SET disabled_at = NULL, enabled_at = extract(epoch FROM :NOW)::float8,
    updated_at = :NOW
WHERE name = %(name)s AND disabled_at IS NOT NULL
RETURNING name;

-- name: cron_states
SELECT name, last_tick, last_job_id, disabled_at, enabled_at FROM conveyor_cron ORDER BY name;

-- name: cron_ticks
SELECT name, last_tick FROM conveyor_cron ORDER BY name;

-- name: record_step
-- First record wins: racing inserts of one (job, step) wait for the first and then do nothing.
-- Only onto the job of this uid (NULL: a job stored before uids): after a restore, the id may
-- name another job, which must not get this one's record.
INSERT INTO conveyor_steps (job_id, step, result)
SELECT %(id)s, %(step)s, %(result)s::json
WHERE EXISTS (SELECT 1 FROM conveyor_jobs WHERE id = %(id)s AND uid IS NOT DISTINCT FROM %(uid)s::text)
ON CONFLICT (job_id, step) DO NOTHING
RETURNING job_id;

-- name: read_step
SELECT EXISTS (SELECT 1 FROM conveyor_jobs WHERE id = %(id)s AND uid IS NOT DISTINCT FROM %(uid)s::text)
           AS job_found,
       s.job_id IS NOT NULL AS found, s.result::text AS result
FROM (SELECT 1) AS one
LEFT JOIN conveyor_steps AS s ON s.job_id = %(id)s AND s.step = %(step)s;

-- name: purge
-- As prune, the deleted jobs' edges go with them and their batches come back for prune_batches.
-- A purge is an operator's order: a job is deleted even if a child of it is unfinished (that
-- child's parent_results() then lacks it).
WITH gone AS (
    DELETE FROM conveyor_jobs
    WHERE state = %(state)s AND (%(queue)s::text IS NULL OR queue = %(queue)s)
      AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
    RETURNING id, has_children, parents, batch_id, callback_of
:FORGET_GONE;

-- name: stats_now
SELECT extract(epoch FROM :NOW)::float8 AS now;

-- name: count_by_state
SELECT queue, state, count(*) AS n FROM conveyor_jobs GROUP BY queue, state;

-- name: count_unfinished
-- Reads the (state, queue, id) index for these states only: cost follows the backlog and
-- the dead-letter queue, not the retained history.
SELECT queue, state, count(*) AS n FROM conveyor_jobs
WHERE state IN ('waiting', 'scheduled', 'available', 'running', 'dead') GROUP BY queue, state;

-- name: due_scheduled
SELECT queue, count(*) AS n, extract(epoch FROM min(run_at))::float8 AS oldest FROM conveyor_jobs
WHERE state = 'scheduled' AND run_at <= :NOW GROUP BY queue;

-- name: oldest_available
SELECT queue, extract(epoch FROM min(run_at))::float8 AS oldest FROM conveyor_jobs
WHERE state = 'available' GROUP BY queue;

-- name: expired_leases
-- Running jobs whose lease ran out, waiting for a reaper (reap's condition).
SELECT queue, count(*) AS n FROM conveyor_jobs
WHERE state = 'running' AND lease_expires_at < :NOW GROUP BY queue;

-- name: counters
SELECT queue, name, value FROM conveyor_counters;

-- name: pause_queue
-- A row only changes if the queue was not paused: its paused_at is when the pause began.
INSERT INTO conveyor_queue_controls AS c (queue, paused_at) VALUES (%(queue)s, :NOW)
ON CONFLICT (queue) DO UPDATE SET paused_at = excluded.paused_at WHERE c.paused_at IS NULL
RETURNING queue;

-- name: resume_queue
UPDATE conveyor_queue_controls SET paused_at = NULL
WHERE queue = %(queue)s AND paused_at IS NOT NULL
RETURNING queue;

-- name: paused_queues
SELECT queue, extract(epoch FROM paused_at)::float8 AS paused_at
FROM conveyor_queue_controls WHERE paused_at IS NOT NULL;

-- name: ready_queues
-- Backend.ready_queues: a probe of each queue's claim and scheduled indexes, as "ready" looks.
SELECT u.q AS queue FROM unnest(%(queues)s::text[]) WITH ORDINALITY AS u(q, i)
WHERE NOT EXISTS (SELECT 1 FROM conveyor_queue_controls AS c
                  WHERE c.queue = u.q AND c.paused_at IS NOT NULL)
  AND (EXISTS (SELECT 1 FROM conveyor_jobs WHERE state = 'available' AND queue = u.q)
       OR EXISTS (SELECT 1 FROM conveyor_jobs WHERE state = 'scheduled' AND queue = u.q
                  AND run_at <= now()))
ORDER BY u.i;

-- name: ready
-- The queues asked about, less the paused ones: their jobs are nobody's to claim, and reporting
-- them would wake an idle worker to an empty claim again and again.
WITH open AS MATERIALIZED (
    SELECT q FROM unnest(%(queues)s::text[]) AS q
    WHERE NOT EXISTS (SELECT 1 FROM conveyor_queue_controls AS c
                      WHERE c.queue = q AND c.paused_at IS NOT NULL)
), wanted AS (SELECT coalesce(array_agg(q), '{}') AS queues FROM open)
SELECT EXISTS (SELECT 1 FROM conveyor_jobs WHERE state = 'available' AND queue = ANY(w.queues))
    OR EXISTS (SELECT 1 FROM conveyor_jobs WHERE state = 'scheduled' AND queue = ANY(w.queues)
               AND run_at <= now()) AS ready,
       extract(epoch FROM (SELECT min(run_at) FROM conveyor_jobs
                           WHERE state = 'scheduled' AND queue = ANY(w.queues)) - now())::float8
           AS next_due_in
FROM wanted AS w;

-- name: record_worker
INSERT INTO conveyor_workers (id, queues, concurrency, host, pid, started_at, last_seen, running, stuck)
VALUES (%(id)s, %(queues)s::jsonb, %(concurrency)s, %(host)s, %(pid)s, %(started_at)s, :NOW, %(running)s, %(stuck)s)
ON CONFLICT (id) DO UPDATE SET last_seen = excluded.last_seen, running = excluded.running, stuck = excluded.stuck;

-- name: forget_workers
DELETE FROM conveyor_workers WHERE last_seen < :NOW - interval '1 day';

-- name: remove_worker
DELETE FROM conveyor_workers WHERE id = %(id)s;

-- name: workers
SELECT id, queues, concurrency, host, pid, started_at, extract(epoch FROM last_seen)::float8 AS last_seen,
       running, stuck
FROM conveyor_workers WHERE last_seen >= :NOW - make_interval(secs => %(ttl)s::float8) ORDER BY started_at;

-- name: insert_batches
INSERT INTO conveyor_batches (id, parent_id, created_at)
SELECT b.id, b.parent_id, :NOW
FROM unnest(%(ids)s::text[], %(parent_ids)s::text[]) WITH ORDINALITY AS b(id, parent_id, ord)
ORDER BY b.ord;

-- name: link_parents
-- A job enqueued after these: lock them in id order, then mark those not marked yet
-- has_children (mark_parent), so that the settling trigger (010_workflows.sql) fires when each
-- finishes. READ COMMITTED: a parent whose finish committed while this waited for its lock
-- comes back in its new state (counted here as finished); one that finishes after this commits
-- fires the trigger, which sees the child. Unknown ids are missing from the rows.
-- A lookup per id, in id order, as in ack_many. (The marks are a statement per parent: an
-- UPDATE joined to these rows could be planned as a scan of the whole table, see ack_many.)
SELECT j.id, j.state, j.has_children
FROM (SELECT DISTINCT unnest(%(ids)s::bigint[]) AS id ORDER BY 1) AS u
CROSS JOIN LATERAL (SELECT id, state, has_children FROM conveyor_jobs WHERE id = u.id
                    FOR NO KEY UPDATE) AS j;

-- name: mark_parent
UPDATE conveyor_jobs SET has_children = true WHERE id = %(id)s RETURNING id;

-- name: insert_after
-- A job of a workflow (parents, a batch, a callback): as insert, with its state decided by the
-- caller from its parents' states (link_parents) and its edges written in the same statement.
-- failed_parent: a parent already dead or cancelled, for a child that is cancelled with it.
WITH ins AS (
INSERT INTO conveyor_jobs (queue, task, args, state, priority, run_at, max_attempts, timeout_s,
                           unique_key, meta, created_at, fair_key, fair_tag, unique_for,
                           concurrency_key, concurrency_limit, rate_key, rate_limit, rate_period,
                           has_children, parents, parents_left, on_parent_failure, batch_id,
                           callback_of, finished_at, errors)
SELECT %(queue)s, %(task)s, %(args)s::json,
       CASE WHEN %(failed_parent)s::bigint IS NOT NULL THEN 'cancelled'
            WHEN %(parents_left)s::integer > 0 THEN 'waiting'
            WHEN r.run_at > t.now THEN 'scheduled' ELSE 'available' END,
       %(priority)s, r.run_at, %(max_attempts)s, %(timeout_s)s, %(unique_key)s, %(meta)s::jsonb, t.now,
       %(fair_key)s,
       coalesce(%(fair_tag)s::bigint,
                (SELECT c.vtime + 1 FROM conveyor_queue_clock AS c
                 WHERE c.queue = %(queue)s AND c.priority = %(priority)s), 1),
       %(unique_for)s::float8,
       %(concurrency_key)s, %(concurrency_limit)s::integer, %(rate_key)s, %(rate_limit)s::integer,
       %(rate_period)s::float8,
       %(has_children)s::boolean, %(parents)s::bigint[], %(parents_left)s::integer,
       %(on_parent_failure)s::text, %(batch_id)s::text, %(callback_of)s::text,
       CASE WHEN %(failed_parent)s::bigint IS NOT NULL THEN t.now END,
       CASE WHEN %(failed_parent)s::bigint IS NULL THEN '[]'::jsonb
            ELSE jsonb_build_array(jsonb_build_object(
                'attempt', 0, 'at', extract(epoch FROM t.now)::float8, 'kind', 'parent_failed',
                'type', 'ParentFailed',
                'message', 'parent job ' || %(failed_parent)s::bigint || ' went dead or was cancelled',
                'traceback', '', 'worker_id', NULL)) END
FROM (SELECT :NOW AS now) AS t,
     LATERAL (SELECT coalesce(to_timestamp(%(run_at)s::float8),
                              t.now + make_interval(secs => %(delay)s::float8)) AS run_at) AS r
WHERE %(unique_key)s::text IS NULL OR NOT EXISTS (
    SELECT 1 FROM conveyor_jobs AS d
    WHERE d.unique_key = %(unique_key)s AND d.state = 'succeeded'
      AND d.finished_at + make_interval(secs => d.unique_for) > t.now)
ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND state IN ('waiting', 'scheduled', 'available', 'running')
DO NOTHING
RETURNING id, uid, state, created_at
), edges AS (
    INSERT INTO conveyor_edges (parent_id, child_id, done)
    SELECT p.id, ins.id, p.done
    FROM ins, unnest(%(parent_ids)s::bigint[], %(parent_done)s::boolean[]) AS p(id, done)
)
SELECT id, uid, state, extract(epoch FROM created_at)::float8 AS at FROM ins;

-- name: get_batch
-- A batch's counts over its members and the members of the batches nested in it, at any depth.
WITH RECURSIVE tree AS (
    SELECT id FROM conveyor_batches WHERE id = %(id)s
    UNION
    SELECT b.id FROM conveyor_batches AS b JOIN tree ON b.parent_id = tree.id
)
SELECT b.id, b.parent_id, extract(epoch FROM b.created_at)::float8 AS created_at,
       (SELECT coalesce(json_object_agg(s.state, s.n), '{}'::json)
        FROM (SELECT j.state, count(*) AS n FROM conveyor_jobs AS j
              WHERE j.batch_id IN (SELECT id FROM tree) GROUP BY j.state) AS s) AS counts,
       (SELECT min(j.id) FROM conveyor_jobs AS j
        WHERE j.callback_of = b.id AND j.on_parent_failure = 'cancel') AS on_success,
       (SELECT min(j.id) FROM conveyor_jobs AS j
        WHERE j.callback_of = b.id AND j.on_parent_failure = 'run') AS on_complete
FROM conveyor_batches AS b WHERE b.id = %(id)s;
