"""SqliteBackend: the Backend contract on one SQLite file in WAL mode, safe for many threads
and processes.

Each transition is one ``BEGIN IMMEDIATE`` transaction, so writers queue on SQLite's lock
(with a busy timeout) instead of failing, taking turns across processes (turns.py). Workers in
this process are woken by an in-process signal; workers in other processes by the file's
writes (filewatch.py, inotify) or a poll, and they check for commits through ``PRAGMA
data_version``.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import Any

from ...errorgroups import ErrorGroups
from ...errors import JobNotFound, LeaseLost, StoreError
from ...job import Job, JobState
from ...payload import check_queue_name
from ..base import (
    ERROR_GROUP_SCAN,
    MAX_STALLS,
    Backend,
    BatchInfo,
    CronState,
    EnqueueResult,
    ErrorInfo,
    Lease,
    NewBatch,
    NewJob,
    Page,
    ReapResult,
    Stats,
    WorkerInfo,
    check_claim_id,
    check_filters,
    new_claim_id,
    queue_stats_from_rows,
)
from . import groups
from .connection import EnqueueGroup, Q, translate
from .flow import Settled, forget, read_batch, settle
from .history import SqliteHistory
from .outbox import SqliteOutbox, mark_created
from .writes import (
    FairTags,
    ack_in,
    claim_in,
    enqueue_in,
    raise_vtime,
    row_to_job,
    step_path,
)

KEEP_ERRORS = 20  # failed attempts a job keeps in its errors list (the newest)
# A queue (q.value, of json_each over the queues asked) holds a job a claim could take now:
# one available, or scheduled and due, a probe of each index. A paused queue's jobs are
# nobody's to claim: reporting them would wake an idle worker to an empty claim again and again.
_READY = """q.value NOT IN (SELECT queue FROM conveyor_queue_controls WHERE paused_at IS NOT NULL)
  AND (EXISTS (SELECT 1 FROM conveyor_jobs WHERE state = 'available' AND queue = q.value)
       OR EXISTS (SELECT 1 FROM conveyor_jobs WHERE state = 'scheduled' AND queue = q.value
                  AND run_at <= (julianday('now') - 2440587.5) * 86400.0))"""
READY_QUEUES = f"SELECT q.value FROM json_each(?) AS q WHERE {_READY} ORDER BY q.key"
ANY_READY = f"SELECT EXISTS (SELECT 1 FROM json_each(?) AS q WHERE {_READY})"  # _wait's look


class SqliteBackend(SqliteHistory, SqliteOutbox, Backend):
    poll_step = 0.002  # seconds between cross-process change checks while idle
    # The same where other processes' writes wake the waiter (filewatch.py): only a safety net.
    watched_poll_step = 0.05
    # After a watched write that shows no new commit yet, how long to look at poll_step for
    # the commit to show (an fsync's time, with synchronous=FULL) before napping again.
    commit_settle = 0.25
    _looked_changes = -1  # the file watch's count at this backend's last idle look (_wait)
    due_check_interval = 0.05  # how often an idle waiter looks for scheduled jobs coming due

    def schema_version(self) -> int:
        return int(self._read("PRAGMA user_version")[0][0])

    def now(self) -> float:
        return float(self._read(Q["now"])[0][0])

    # -- producer ---------------------------------------------------------------------
    def enqueue_many(self, jobs: Sequence[NewJob], *, now: float | None = None,
                     batches: Sequence[NewBatch] = ()) -> list[EnqueueResult]:
        if not jobs and not batches:
            return []
        with self._group_lock:
            group = self._group
            lead = group is None
            if group is None:
                group = self._group = EnqueueGroup()
            index = len(group.calls)
            group.calls.append((jobs, now, batches))
        if lead:
            self._write_group(group)
        else:
            group.done.wait()
        result = group.results[index]
        if isinstance(result, BaseException):
            raise result
        return result

    def _write_group(self, group: EnqueueGroup) -> None:
        """Write a group's enqueues in one transaction, each call in a savepoint of its own: one
        refused (QueueFull) leaves the others written."""
        results: list[list[EnqueueResult] | BaseException] = []
        try:
            with self._write(None) as (conn, t):
                with self._group_lock:  # the lock is ours: a call from now on starts the next group
                    self._group = None
                alone = len(group.calls) == 1
                for jobs, now, batches in group.calls:
                    if alone:  # no savepoint needed: a failure rolls the transaction back
                        results.append(self._enqueue_in(conn, jobs, t if now is None else now,
                                                        batches))
                        continue
                    conn.execute("SAVEPOINT enqueue")
                    try:
                        results.append(self._enqueue_in(conn, jobs, t if now is None else now,
                                                        batches))
                    except Exception as exc:
                        conn.execute("ROLLBACK TO enqueue")
                        results.append(translate(exc, "write failed, nothing was changed")
                                       if isinstance(exc, sqlite3.Error) else exc)
                    conn.execute("RELEASE enqueue")
        except BaseException as exc:
            with self._group_lock:
                if self._group is group:
                    self._group = None
            results = [exc] * len(group.calls)
        finally:
            group.results = results
            group.done.set()
        if any(isinstance(r, list) and any(e.created for e in r) for r in results):
            self._signal.fire()

    def _enqueue_in(self, conn: sqlite3.Connection, jobs: Sequence[NewJob], t: float,
                    batches: Sequence[NewBatch] = ()) -> list[EnqueueResult]:
        results = enqueue_in(conn, jobs, t, batches)
        if self.outbox:
            mark_created(conn, results)
        return results

    def cron_enqueue(self, schedule: str, tick: float, job: NewJob | None, *,
                     now: float | None = None) -> EnqueueResult | None:
        with self._write(now) as (conn, t):
            params = {"name": schedule, "tick": tick, "now": t}
            if conn.execute(Q["cron_take"], params).rowcount != 1:
                return None  # this tick or a later one was taken already
            if job is None or not conn.execute(Q["cron_runs"], params).fetchone()["runs"]:
                return None  # a first sight, or a disabled schedule: the tick is only recorded
            [result] = self._enqueue_in(conn, [job], t)  # QueueFull rolls the tick back too
            conn.execute(Q["cron_last_job"], {"name": schedule, "id": result.id})
        if result.created:
            self._signal.fire()
        return result

    def cron_ticks(self) -> dict[str, float]:
        return {r["name"]: r["last_tick"] for r in self._read(Q["cron_ticks"])}

    def set_cron_enabled(self, schedule: str, enabled: bool, *,
                         now: float | None = None) -> bool:
        with self._write(now) as (conn, t):
            changed = conn.execute(Q["cron_enable" if enabled else "cron_disable"],
                                   {"name": schedule, "now": t})
            return changed.rowcount == 1

    def cron_states(self) -> dict[str, CronState]:
        return {r["name"]: CronState(r["name"], r["last_tick"], r["last_job_id"],
                                     r["disabled_at"], r["enabled_at"])
                for r in self._read(Q["cron_states"])}

    def record_step(self, job_id: int, step: str, result: str | None, *,
                    uid: str | None) -> tuple[bool, str | None]:
        path = step_path(step)
        with self._write(None) as (conn, _):
            params = {"id": job_id, "path": path, "uid": uid,
                      "result": "null" if result is None else result}
            if conn.execute(Q["record_step"], params).rowcount == 1:
                return True, result
            row = conn.execute(Q["read_step"], {"id": job_id, "path": path, "uid": uid}).fetchone()
        if row is None:
            # No such job, or the id names another job now (a restored store counted the id
            # out again): either way not this job.
            raise JobNotFound(f"no job with id {job_id} and uid {uid}")
        value = row["value"]
        return False, None if value in (None, "null") else value

    # -- worker -----------------------------------------------------------------------
    def claim(
        self, queue: str, limit: int, *, worker_id: str, lease_s: float, now: float | None = None,
        start: int | None = None, claim_id: str | None = None,
    ) -> list[Job]:
        claim_id = new_claim_id() if claim_id is None else check_claim_id(claim_id)
        if limit <= 0:
            return []
        with self._write(now) as (conn, t):
            return claim_in(conn, t, queue, limit, worker_id, lease_s, start, claim_id)

    def take(self, job_id: int, token: str, *, worker_id: str, lease_s: float,
             now: float | None = None, message: str | None = None) -> Job | None:
        settled = None
        with self._write(now) as (conn, t):
            was = conn.execute("SELECT state FROM conveyor_jobs WHERE id = ?", (job_id,)).fetchone()
            row = conn.execute(Q["take"], {
                "id": job_id, "token": token, "worker_id": worker_id, "lease_s": lease_s,
                "now": t, "keep_errors": KEEP_ERRORS, "message": message}).fetchone()
            if row is None:
                return None
            if was["state"] == "running":  # its lease was lost: counted as reap counts one
                conn.execute(Q["count_up"], {"queue": row["queue"], "name": "lease_expired",
                                             "n": 1})
            if row["state"] == "running":
                raise_vtime(conn, row["queue"], [row])  # its round is done, as a claim's
                return row_to_job(row)
            # Spent: its last attempt's lease was lost; dead now, as reap makes it.
            if row["has_children"]:
                settled = settle(conn, t, [(job_id, "dead")])
        self._finished((job_id,), settled)
        return None

    def ack_and_claim(
        self, acks: Sequence[tuple[Lease, str | None]], queue: str, limit: int, *,
        worker_id: str, lease_s: float, now: float | None = None, start: int | None = None,
    ) -> tuple[list[bool], list[Job]]:
        """One transaction: a commit (and its fsync under synchronous=full) for both."""
        settled = Settled()
        with self._write(now) as (conn, t):
            held = ack_in(conn, t, acks, settled)
            jobs = (claim_in(conn, t, queue, limit, worker_id, lease_s, start, new_claim_id())
                    if limit > 0 else [])
        self._finished([lease.job_id for lease, _ in acks], settled)
        return held, jobs

    def release_claim(self, queue: str, claim_id: str, *, now: float | None = None) -> list[int]:
        check_claim_id(claim_id)
        with self._write(now) as (conn, _):
            rows = conn.execute(
                Q["release_claim"], {"queue": queue, "claim_id": claim_id}).fetchall()
        if rows:
            self._signal.fire()
        return sorted(r["id"] for r in rows)

    def heartbeat(self, leases: Sequence[Lease], *, lease_s: float, now: float | None = None,
                  held: Collection[int] = ()) -> set[int]:
        if not leases:
            return set()
        lost: set[int] = set()
        with self._write(now) as (conn, t):
            for lease in leases:
                cur = conn.execute(
                    Q["heartbeat"], {"id": lease.job_id, "token": lease.token, "now": t,
                                     "lease_s": lease_s, "held": lease.job_id in held}
                )
                if cur.rowcount != 1:
                    lost.add(lease.job_id)
        return lost

    def ack(self, lease: Lease, result: str | None, *, now: float | None = None) -> None:
        settled = None
        with self._write(now) as (conn, t):
            row = conn.execute(Q["ack"], {"id": lease.job_id, "token": lease.token, "now": t,
                                          "result": result}).fetchone()
            if row is None:
                raise LeaseLost(lease.job_id, "ack refused")
            if row[0]:  # has children
                settled = settle(conn, t, [(lease.job_id, "succeeded")])
        self._finished((lease.job_id,), settled)

    def _finished(self, job_ids: Iterable[int], settled: Settled | None) -> None:
        """After the commit: wake job.wait for the jobs finished (the cascade's too), and idle
        workers for children that became available, as an enqueue does."""
        if settled is not None and settled.ready:
            self._signal.fire()
        if self._signal.waited:
            if settled is not None and settled.finished:
                job_ids = [*job_ids, *settled.finished]
            self._signal.finished(job_ids)

    def ack_many(self, acks: Sequence[tuple[Lease, str | None]], *,
                 now: float | None = None) -> list[bool]:
        if not acks:
            return []
        settled = Settled()
        with self._write(now) as (conn, t):
            held = ack_in(conn, t, acks, settled)
        self._finished([lease.job_id for lease, _ in acks], settled)
        return held

    def retry(self, lease: Lease, error: ErrorInfo, *, delay: float,
              now: float | None = None) -> JobState:
        settled = None
        with self._write(now) as (conn, t):
            row = conn.execute(
                Q["retry"],
                {
                    "id": lease.job_id, "token": lease.token, "now": t,
                    "delay": max(float(delay), 0.0),
                    "keep_errors": KEEP_ERRORS, "error": self._error_json(conn, lease, error, t),
                },
            ).fetchone()
            if row is None:
                raise LeaseLost(lease.job_id, "retry refused")
            state = JobState(row[0])
            if state is JobState.DEAD and row[1]:
                settled = settle(conn, t, [(lease.job_id, "dead")])
        if state is JobState.AVAILABLE:
            self._signal.fire()
        elif state is JobState.DEAD:
            self._finished((lease.job_id,), settled)
        return state

    def kill(self, lease: Lease, error: ErrorInfo, *, now: float | None = None) -> None:
        settled = None
        with self._write(now) as (conn, t):
            row = conn.execute(
                Q["kill"],
                {
                    "id": lease.job_id, "token": lease.token, "now": t,
                    "keep_errors": KEEP_ERRORS, "error": self._error_json(conn, lease, error, t),
                },
            ).fetchone()
            if row is None:
                raise LeaseLost(lease.job_id, "kill refused")
            if row[0]:
                settled = settle(conn, t, [(lease.job_id, "dead")])
        self._finished((lease.job_id,), settled)

    @staticmethod
    def _error_json(conn: sqlite3.Connection, lease: Lease, error: ErrorInfo, t: float) -> str:
        row = conn.execute("SELECT attempt, worker_id FROM conveyor_jobs WHERE id = ?",
                           (lease.job_id,)).fetchone()
        attempt, worker_id = (row[0], row[1]) if row else (0, None)
        return json.dumps(error.as_dict(attempt, t, worker_id), ensure_ascii=False)

    def release(self, leases: Sequence[Lease], *, now: float | None = None) -> list[int]:
        if not leases:
            return []
        released: list[int] = []
        with self._write(now) as (conn, _):
            for lease in leases:
                cur = conn.execute(Q["release"], {"id": lease.job_id, "token": lease.token})
                if cur.rowcount == 1:
                    released.append(lease.job_id)
        if released:
            self._signal.fire()
        return released

    # -- maintenance ------------------------------------------------------------------
    def reap(self, *, limit: int = 1000, now: float | None = None) -> ReapResult:
        with self._write(now) as (conn, t):
            rows = conn.execute(Q["reap"], {"now": t, "limit": limit, "keep_errors": KEEP_ERRORS,
                                            "max_stalls": MAX_STALLS}).fetchall()
            per_queue: dict[str, int] = {}
            for row in rows:
                per_queue[row["queue"]] = per_queue.get(row["queue"], 0) + 1
            for queue, n in per_queue.items():
                conn.execute(Q["count_up"], {"queue": queue, "name": "lease_expired", "n": n})
            parents = [(r["id"], "dead") for r in rows
                       if r["state"] == "dead" and r["has_children"]]
            settled = settle(conn, t, parents) if parents else None
        result = ReapResult(
            requeued=sorted(r["id"] for r in rows if r["state"] == "available"),
            dead=sorted(r["id"] for r in rows if r["state"] == "dead"),
            queues={r["id"]: r["queue"] for r in rows},
        )
        if result.requeued:
            self._signal.fire()
        if result.dead:
            self._finished(result.dead, settled)
        return result

    def promote(self, *, limit: int = 1000, now: float | None = None) -> int:
        with self._write(now) as (conn, t):
            n = conn.execute(Q["promote"], {"now": t, "limit": limit}).rowcount
        if n:
            self._signal.fire()
        return n

    def prune(
        self, *, older_than: float, states: Sequence[JobState] = (JobState.SUCCEEDED,),
        limit: int = 1000, now: float | None = None,
    ) -> int:
        deleted = 0
        with self._write(now) as (conn, t):
            for state in states:
                if not JobState(state).is_final:
                    raise ValueError(f"prune only deletes finished jobs, not {state}")
                left = limit - deleted
                if left <= 0:
                    break
                rows = conn.execute(
                    Q["prune"], {"state": str(state), "before": t - older_than, "limit": left}
                ).fetchall()
                forget(conn, rows)
                deleted += len(rows)
            conn.execute(Q["prune_fair_tags"], {"limit": limit})
            conn.execute(Q["prune_rate_claims"], {"now": t, "limit": limit})
        return deleted

    # -- inspection and administration ------------------------------------------------
    def get(self, job_id: int) -> Job | None:
        rows = self._read(Q["get"], {"id": job_id})
        return row_to_job(rows[0]) if rows else None

    def get_batch(self, batch_id: str) -> BatchInfo | None:
        try:
            with self._using() as conn:
                conn.execute("BEGIN")  # the batch and its counts from one snapshot
                try:
                    return read_batch(conn, batch_id)
                finally:
                    conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise translate(exc, "read failed") from exc

    def list_jobs(
        self, *, state: JobState | None = None, queue: str | None = None, task: str | None = None,
        cursor: int | None = None, limit: int = 50,
    ) -> Page:
        check_filters(queue=queue, task=task)
        where: list[str] = []
        params: dict[str, Any] = {}
        if state is not None:
            where.append("state = :state")
            params["state"] = str(state)
        if queue is not None:
            where.append("queue = :queue")
            params["queue"] = queue
        if task is not None:
            where.append("task = :task")
            params["task"] = task
        if cursor is not None:
            where.append("id < :cursor")
            params["cursor"] = cursor
        sql = "SELECT * FROM conveyor_jobs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT :limit"
        params["limit"] = limit + 1
        rows = self._read(sql, params)
        jobs = [row_to_job(r) for r in rows[:limit]]
        return Page(jobs=jobs, next_cursor=jobs[-1].id if len(rows) > limit and jobs else None)

    def stats(self, *, now: float | None = None, worker_ttl: float = 60.0,
              finished: bool = True) -> Stats:
        with self._using() as conn:
            return self._stats(conn, now, worker_ttl, finished)

    def _stats(self, conn: sqlite3.Connection, now: float | None, worker_ttl: float,
               finished: bool) -> Stats:
        try:
            conn.execute("BEGIN")  # one consistent snapshot for every number
            try:
                t = now if now is not None else conn.execute(Q["now"]).fetchone()[0]
                counts = conn.execute(
                    Q["count_by_state" if finished else "count_unfinished"]).fetchall()
                due = conn.execute(Q["due_scheduled"], {"now": t}).fetchall()
                oldest = conn.execute(Q["oldest_available"]).fetchall()
                counters = conn.execute(Q["counters"]).fetchall()
                expired = conn.execute(Q["expired_leases"], {"now": t}).fetchall()
                workers = conn.execute(Q["workers"], {"since": t - worker_ttl}).fetchall()
                paused = conn.execute(Q["paused_queues"]).fetchall()
            finally:
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise translate(exc, "stats failed") from exc

        queues = queue_stats_from_rows(t, counts, due, oldest, counters, expired,
                                       {r["queue"]: r["paused_at"] for r in paused})
        return Stats(
            now=t,
            queues=queues,
            workers=[
                WorkerInfo(
                    id=w["id"], queues=json.loads(w["queues"]), concurrency=w["concurrency"],
                    host=w["host"], pid=w["pid"], started_at=w["started_at"],
                    last_seen=w["last_seen"], running=w["running"], stuck=w["stuck"],
                )
                for w in workers
            ],
        )

    def redrive(self, job_ids: Sequence[int] | None = None, *, queue: str | None = None,
                now: float | None = None) -> int:
        check_filters(queue=queue)
        with self._write(now) as (conn, t):
            if job_ids is None:
                back = conn.execute(Q["redrive_all"], {"now": t, "queue": queue}).fetchall()
                # Newest first, one by one: of several dead jobs sharing a key, one comes back.
                keyed = conn.execute(Q["dead_with_unique_key"], {"queue": queue}).fetchall()
                ids = [r[0] for r in keyed]
            else:
                back, ids = [], list(job_ids)
            for i in ids:
                back += conn.execute(Q["redrive"], {"now": t, "id": i}).fetchall()
            FairTags(conn).retag(back)
        if back:
            self._signal.fire()
        return len(back)

    def purge(self, *, state: JobState = JobState.DEAD, queue: str | None = None,
              job_ids: Sequence[int] | None = None) -> int:
        state = JobState(state)
        if not state.is_final:
            raise ValueError(f"purge only deletes finished jobs, not {state}")
        check_filters(queue=queue)
        sql = ("DELETE FROM conveyor_jobs WHERE state = :state"
               " AND (:queue IS NULL OR queue = :queue)")
        back = " RETURNING id, has_children, parents, batch_id"
        with self._write(None) as (conn, _):
            if job_ids is None:
                rows = conn.execute(sql + back, {"state": str(state), "queue": queue}).fetchall()
            else:
                rows = [row for i in job_ids for row in conn.execute(
                    sql + " AND id = :id" + back,
                    {"state": str(state), "queue": queue, "id": i}).fetchall()]
            forget(conn, rows)
            return len(rows)

    def cancel(self, job_id: int, *, now: float | None = None) -> bool:
        settled = None
        with self._write(now) as (conn, t):
            row = conn.execute(Q["cancel"], {"id": job_id, "now": t}).fetchone()
            if row is not None and row[0]:
                settled = settle(conn, t, [(job_id, "cancelled")])
        if row is not None:
            self._finished((job_id,), settled)
        return row is not None

    def cancel_many(self, job_ids: Sequence[int], *, now: float | None = None) -> list[int]:
        ids = sorted({int(i) for i in job_ids})
        if not ids:
            return []
        settled = Settled()
        with self._write(now) as (conn, t):
            done, parents = groups.cancel_many(conn, ids, t)
            # Only once the call's jobs are all cancelled: a child named in the call is
            # cancelled by the call, not by its parent's cascade.
            if parents:
                settle(conn, t, [(i, "cancelled") for i in parents], settled)
        if done:
            self._finished(done, settled)
        return done

    # -- error groups and bulk actions -------------------------------------------------
    def error_groups(self, *, state: JobState = JobState.DEAD, queue: str | None = None,
                     task: str | None = None, limit: int = 100,
                     scan: int = ERROR_GROUP_SCAN) -> ErrorGroups:
        state = JobState(state)
        if state not in (JobState.DEAD, JobState.SCHEDULED):
            raise ValueError(f"error groups are of dead or scheduled jobs, not {state}")
        check_filters(queue=queue, task=task)
        try:
            with self._using() as conn:
                return groups.error_groups(conn, str(state), queue, task, limit, scan)
        except sqlite3.Error as exc:
            raise translate(exc, "read failed") from exc

    def make_due(self, job_ids: Sequence[int], *, now: float | None = None) -> int:
        if not job_ids:
            return 0
        with self._write(now) as (conn, t):
            n = groups.make_due(conn, job_ids, t)
        if n:
            self._signal.fire()
        return n

    @contextlib.contextmanager
    def finish_watch(self, job_id: int) -> Iterator[Callable[[float], None]]:
        """Woken at once by a finish in this process (any backend on the same file). SQLite
        tells nothing across processes: a job another process finishes is seen by the looks
        at its row (``finish_poll``)."""
        signal = self._signal
        cond = signal.finish_cond
        with cond:
            signal.waited[job_id] = signal.waited.get(job_id, 0) + 1
            seen = signal.finishes

        def sleep(seconds: float) -> None:
            # A finish since the last look (between it and this sleep, too) returns at once.
            nonlocal seen
            with cond:
                if signal.finishes == seen:
                    cond.wait(seconds)
                seen = signal.finishes

        try:
            yield sleep
        finally:
            with cond:
                left = signal.waited.pop(job_id) - 1
                if left:
                    signal.waited[job_id] = left

    def ready_queues(self, queues: Sequence[str]) -> list[str]:
        if not queues:
            return []
        with self._using() as conn:
            rows = conn.execute(READY_QUEUES, (json.dumps(list(queues)),)).fetchall()
        return [r[0] for r in rows]

    def wait_for_jobs(self, queues: Sequence[str], timeout: float, *, verify: bool = True) -> bool:
        # ``verify`` changes nothing here: a change seen in the file is checked with one cheap
        # read before it is reported (an in-process wake-up is reported as is either way).
        return self._wait(queues, timeout)

    def _wait(self, queues: Sequence[str], timeout: float) -> bool:
        # Each look at the file is a call of its own, and the sleeps between them are outside
        # any call: a fork (see _before_fork) never waits for an idle worker. A data_version
        # is only comparable on one connection: a look on another one (reopened after a fork)
        # counts as a change.
        deadline = time.monotonic() + timeout
        generation = self._signal.generation
        with self._using() as conn:
            seen = (conn, conn.execute("PRAGMA data_version").fetchone()[0])
        next_due_check = 0.0
        asked = (json.dumps(list(queues)),)
        # A look first, then naps between looks: a job that came in since the caller's last
        # claim (under a steady load, often one) is reported at once, not after a nap.
        signal = self._signal
        self._watching()  # (made by the first idle wait)
        # Writes since this backend's last look count as unseen: one that came between the
        # caller's empty claim and this wait (a commit on its way) is looked for, not napped on.
        last_changes = self._looked_changes if self._looked_changes >= 0 else signal.changes
        settle_until = 0.0
        while True:
            if self._closed:
                return True  # closed under us: a wake-up (the next call says it is closed)
            changes = signal.changes  # a write after this is looked at, not slept through
            nudged, last_changes = changes != last_changes, changes
            self._looked_changes = changes
            try:
                with self._using() as conn:
                    current = (conn, conn.execute("PRAGMA data_version").fetchone()[0])
                    tick = time.monotonic()
                    if current != seen:
                        settle_until = 0.0
                    elif nudged:
                        # The file was written and no commit shows yet: a commit on its way (a
                        # WAL write comes before its fsync and before the commit is published in
                        # the -shm index, which is written through a mapping inotify does not
                        # see). Look at the short step until it shows, or for commit_settle.
                        settle_until = tick + self.commit_settle
                    if current != seen or tick >= next_due_check:
                        # Another process committed something (or time passed): look before
                        # claiming, so idle workers don't take the write lock for nothing.
                        seen = current
                        next_due_check = tick + self.due_check_interval
                        if conn.execute(ANY_READY, asked).fetchone()[0]:
                            return True
            except StoreError:
                if self.closed:  # closed under us (a race with the check above): a wake-up too
                    return True
                raise
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            watched = signal.watched and time.monotonic() >= settle_until
            nap = self.watched_poll_step if watched else self.poll_step
            with signal.cond:
                if signal.generation != generation:
                    return True
                if signal.changes == changes:
                    signal.cond.wait(min(remaining, nap))
                if signal.generation != generation:
                    return True

    # -- pausing queues ---------------------------------------------------------------
    def pause_queue(self, queue: str, *, now: float | None = None) -> bool:
        check_queue_name(queue)
        with self._write(now) as (conn, t):
            return conn.execute(Q["pause_queue"], {"queue": queue, "now": t}).rowcount == 1

    def resume_queue(self, queue: str, *, now: float | None = None) -> bool:
        check_queue_name(queue)
        with self._write(now) as (conn, _):
            changed = conn.execute(Q["resume_queue"], {"queue": queue}).rowcount == 1
        if changed:
            # Idle waiters of this process at once; those of other processes see the commit
            # change the file (data_version) and look again.
            self._signal.fire()
        return changed

    def paused_queues(self) -> dict[str, float]:
        with self._using() as conn:
            try:
                rows = conn.execute(Q["paused_queues"]).fetchall()
            except sqlite3.Error as exc:
                raise translate(exc, "reading paused queues failed") from exc
        return {r["queue"]: r["paused_at"] for r in rows}

    def wake(self) -> None:
        """Wake this process's idle waiters (used on shutdown)."""
        self._signal.fire()

    # -- workers ----------------------------------------------------------------------
    def record_worker(self, info: WorkerInfo, *, now: float | None = None) -> None:
        with self._write(now) as (conn, t):
            conn.execute(
                Q["record_worker"],
                {
                    "id": info.id, "queues": json.dumps(info.queues),
                    "concurrency": info.concurrency,
                    "host": info.host, "pid": info.pid, "started_at": info.started_at, "now": t,
                    "running": info.running, "stuck": info.stuck,
                },
            )
            # Rows of workers gone for a day are only noise.
            conn.execute(Q["forget_workers"], {"before": t - 86400})

    def remove_worker(self, worker_id: str) -> None:
        with self._write(None) as (conn, _):
            conn.execute(Q["remove_worker"], {"id": worker_id})

