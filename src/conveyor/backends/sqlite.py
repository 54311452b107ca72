"""The embedded backend: one SQLite file in WAL mode, safe for many threads and processes.

Each transition is one ``BEGIN IMMEDIATE`` transaction, so writers queue on SQLite's lock
(with a busy timeout) instead of failing. Workers in this process are woken by an in-process
signal; workers in other processes notice commits through ``PRAGMA data_version``.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ..errors import (
    ConfigurationError,
    InvalidName,
    JobNotFound,
    LeaseLost,
    StorageFull,
    StoreError,
)
from ..job import Job, JobState, make_job
from ..payload import NAME_RE
from . import forking
from .base import (
    CLAIM_SCAN,
    MAX_STALLS,
    Backend,
    EnqueueResult,
    ErrorInfo,
    Lease,
    NewJob,
    Page,
    ReapResult,
    Stats,
    StoreLock,
    WorkerInfo,
    check_claim_id,
    check_filters,
    check_lock_name,
    depth_limits,
    new_claim_id,
    new_uids,
    queue_stats_from_rows,
    refuse_overflow,
)
from .sql import load_migrations, load_queries
from .sql import split_statements as _split_sql

log = logging.getLogger("conveyor.sqlite")
Q = load_queries("sqlite")
MIGRATIONS = load_migrations("sqlite")
KEEP_ERRORS = 20


@dataclass
class _Signal:
    """Per database file and process: wakes idle workers when this process makes jobs
    available, and queues this process's writers on a lock of our own, because SQLite's
    busy handler waits by sleeping (up to 100 ms a nap) where a lock hands over at once."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    generation: int = 0
    write_lock: threading.Lock = field(default_factory=threading.Lock)

    def fire(self) -> None:
        with self.cond:
            self.generation += 1
            self.cond.notify_all()


@dataclass
class _Group:
    """Enqueue calls written together in one transaction: one commit, one sync (group commit).
    The first call to come leads: it writes them all once it holds the write lock, and every
    call that comes while it waits for the lock joins its group."""

    calls: list[tuple[Sequence[NewJob], float | None]] = field(default_factory=list)
    results: list[list[EnqueueResult] | BaseException] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)


_signals: dict[str, _Signal] = {}
_signals_lock = threading.Lock()


def _signal_for(path: str) -> _Signal:
    with _signals_lock:
        return _signals.setdefault(path, _Signal())


def _fresh_signals() -> None:
    # A forked child's copies may be held (a writer of the parent's, mid-transaction) by a
    # thread that does not exist here: it would wait on them for ever.
    global _signals, _signals_lock
    _signals, _signals_lock = {}, threading.Lock()


forking.on_fork_in_child(_fresh_signals)

# Every live backend of the process, for the fork hooks (see SqliteBackend._before_fork).
_backends: weakref.WeakSet[SqliteBackend] = weakref.WeakSet()
FORK_DRAIN_S = 60.0  # a fork waits this long at most for calls in progress (each within busy_timeout)


def _before_fork() -> None:
    for backend in list(_backends):
        backend._before_fork()


def _after_fork_in_parent() -> None:
    for backend in list(_backends):
        backend._after_fork_in_parent()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent)


def parse_sqlite_url(url: str) -> tuple[str, dict[str, str]]:
    """``sqlite:///relative.db``, ``sqlite:////abs/path.db``, optional ``?synchronous=full&busy_timeout=10``."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite":
        raise ConfigurationError(f"not a sqlite URL: {url!r}")
    raw = parts.netloc + parts.path
    path = raw[1:] if raw.startswith("/") else raw
    if not path or path == ":memory:":
        raise ConfigurationError(
            f"{url!r}: give a file path (sqlite:///conveyor.db); an in-memory database "
            "cannot be shared between a worker and its producers"
        )
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    unknown = set(options) - {"synchronous", "busy_timeout"}
    if unknown:
        raise ConfigurationError(f"{url!r}: unknown option(s) {sorted(unknown)}; known: synchronous, busy_timeout")
    return os.path.abspath(path), options


class SqliteBackend(Backend):
    poll_step = 0.002  # seconds between cross-process change checks while idle
    due_check_interval = 0.05  # how often an idle waiter looks for scheduled jobs coming due

    def __init__(self, url: str) -> None:
        self.url = url
        self.path, options = parse_sqlite_url(url)
        # FULL: a commit is on disk when the call returns, through a power cut too. NORMAL syncs
        # the WAL only at checkpoints: a power cut can take back the last acknowledged commits.
        sync = options.get("synchronous", "full").upper()
        if sync not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ConfigurationError(f"{url!r}: synchronous must be off, normal, full or extra")
        self._synchronous = sync
        try:
            self._busy_timeout = float(options.get("busy_timeout", "30"))
        except ValueError:
            raise ConfigurationError(f"{url!r}: busy_timeout must be a number of seconds") from None
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        # Calls in progress per connection: close() may come from another thread while a
        # call (a reaper left running by a stopped worker, say) is inside SQLite, and closing
        # a connection under a running statement crashes the process; such a connection is
        # closed by the call that holds it, as it returns.
        self._in_use: dict[sqlite3.Connection, int] = {}
        self._lock = threading.Condition(threading.Lock())
        self._closed = False
        self._calls = 0  # calls in progress, counted once per thread (see _before_fork)
        self._forking = False
        self._group: _Group | None = None  # enqueues waiting for the write lock (see _Group)
        self._group_lock = threading.Lock()
        self._signal = _signal_for(self.path)
        self._locks: set[_FileLock] = set()  # store-wide locks this backend holds (try_lock)
        self._migrate()
        _backends.add(self)
        forking.register(self)

    # -- connections ------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            if self._closed:
                raise StoreError("this backend is closed")
            try:
                conn = sqlite3.connect(
                    self.path, timeout=self._busy_timeout, isolation_level=None, check_same_thread=False
                )
                conn.row_factory = sqlite3.Row
                self._enter_wal(conn)
                conn.execute(f"PRAGMA synchronous = {self._synchronous}")
                # A checkpointed WAL is cut back to this size instead of keeping its peak forever.
                conn.execute("PRAGMA journal_size_limit = 16777216")
            except sqlite3.Error as exc:
                raise _translate(exc, f"cannot open SQLite database {self.path}") from exc
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def _enter_wal(self, conn: sqlite3.Connection) -> None:
        """Switch a new file to WAL. Processes opening a fresh file at once race for the switch,
        which needs the file to themselves, and SQLite can refuse it at once ("database is
        locked") without waiting out busy_timeout: retried here, within busy_timeout."""
        deadline = time.monotonic() + self._busy_timeout
        pause = 0.005
        while True:
            try:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc):
                    raise self._no_wal(str(exc)) from exc
                if time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
        # SQLite answers with the mode it is in: one that cannot switch keeps the old one.
        if str(mode).lower() != "wal":
            raise self._no_wal(f"journal_mode stayed {mode!r}")

    def _no_wal(self, why: str) -> StoreError:
        folder, name = os.path.split(self.path)
        return StoreError(
            f"SQLite cannot use WAL mode for {self.path} ({why}). Conveyor needs it: SQLite keeps "
            f"{name}-wal and {name}-shm beside the database, so {folder} must be writable, and on a "
            "local file system (not NFS, SMB or another network file system, nor a read-only mount)"
        )

    # -- fork --------------------------------------------------------------------------
    # SQLite keeps per-process state beside each connection: its mutexes, and what POSIX locks
    # this process holds on the file and its WAL index. A child copied while a thread was
    # inside SQLite can hang on a mutex for ever; one copied with connections open starts
    # out believing it holds locks it does not (another process may then checkpoint or
    # delete the WAL under it). So a fork first lets the calls in progress finish, keeps new
    # ones out, and closes this process's connections; both processes reopen theirs on use.
    def _before_fork(self) -> None:
        with self._lock:
            self._forking = True
            own = 1 if getattr(self._local, "depth", 0) else 0
            if not self._lock.wait_for(lambda: self._calls <= own, FORK_DRAIN_S) or own:
                log.warning("SQLite %s: a call was still running when the process forked; the child "
                            "must not use this store", self.path)
                return
            conns, self._all = self._all, []
            self._local = threading.local()
        for conn in conns:
            with suppress(sqlite3.Error):
                conn.close()

    def _after_fork_in_parent(self) -> None:
        with self._lock:
            self._forking = False
            self._lock.notify_all()

    def _after_fork_in_child(self) -> None:
        # Whatever is still open (a call was running at the fork) is the parent's: kept, never
        # used or closed here.
        forking.keep_inherited(self._local, self._all, self._in_use)
        # Its store-wide locks' descriptors share the parent's flock: an unlock would free it.
        forking.keep_inherited(self._locks)
        self._locks = set()
        self._local = threading.local()
        self._all, self._in_use = [], {}
        self._lock = threading.Condition(threading.Lock())
        self._calls, self._forking = 0, False
        self._group, self._group_lock = None, threading.Lock()
        self._signal = _signal_for(self.path)

    @property
    def closed(self) -> bool:
        return self._closed

    @contextmanager
    def _using(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection for one call; see ``_in_use``. While the process forks, a
        new call waits for the fork to be done (see _before_fork)."""
        local = self._local
        depth = getattr(local, "depth", 0)
        if not depth:
            with self._lock:
                while self._forking:
                    self._lock.wait()
                self._calls += 1
        local.depth = depth + 1
        try:
            conn = self._conn()
            with self._lock:
                if self._closed:
                    raise StoreError("this backend is closed")
                self._in_use[conn] = self._in_use.get(conn, 0) + 1
            try:
                yield conn
            finally:
                with self._lock:
                    left = self._in_use.pop(conn) - 1
                    if left:
                        self._in_use[conn] = left
                    last_out = not left and self.closed
                if last_out:
                    with suppress(sqlite3.Error):
                        conn.close()
        finally:
            local.depth = depth
            if not depth:
                with self._lock:
                    self._calls -= 1
                    if self._forking and not self._calls:
                        self._lock.notify_all()

    @contextmanager
    def _write(self, now: float | None) -> Iterator[tuple[sqlite3.Connection, float]]:
        """One write transaction, with the store's time read once at its start."""
        with self._using() as conn, self._signal.write_lock:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise _translate(exc, "cannot start a write transaction") from exc
            try:
                t = now if now is not None else conn.execute(Q["now"]).fetchone()[0]
                yield conn, t
                conn.execute("COMMIT")
            except BaseException as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise _translate(exc, "write failed, nothing was changed") from exc
                raise

    def _read(self, sql: str, params: dict[str, Any] | Sequence[Any] = ()) -> list[sqlite3.Row]:
        try:
            with self._using() as conn:
                return conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise _translate(exc, "read failed") from exc

    def _migrate(self) -> None:
        # In a write transaction even when there is nothing to migrate: a store SQLite can read
        # but not write (its WAL index cannot be written: see _no_wal) fails here, at open, and
        # not at the first enqueue. It commits nothing then, so it costs no sync.
        try:
            with self._write(None) as (c, _):
                current = c.execute("PRAGMA user_version").fetchone()[0]
                for version, script in MIGRATIONS:
                    if version <= current:
                        continue
                    for statement in _split_sql(script):
                        c.execute(statement)
                    c.execute(f"PRAGMA user_version = {version}")
        except StoreError as exc:
            cause = exc.__cause__
            if isinstance(cause, sqlite3.Error) and (cause.sqlite_errorname or "").startswith("SQLITE_READONLY"):
                raise self._no_wal(str(cause)) from cause
            raise

    def schema_version(self) -> int:
        return int(self._read("PRAGMA user_version")[0][0])

    def now(self) -> float:
        return float(self._read(Q["now"])[0][0])

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._all = self._all, []
            idle = [c for c in conns if c not in self._in_use]
            locks, self._locks = self._locks, set()
        for held in locks:
            held.release()
        for conn in idle:
            with suppress(sqlite3.Error):
                conn.close()
        self._local = threading.local()

    def try_lock(self, name: str, *, ttl: float) -> StoreLock | None:
        """An exclusive ``flock`` on a file next to the database, ``<file>-<name>.lock``: every
        process on the file's machine sees it (as it sees the database's own locks), and the
        operating system drops it when its holder exits. Not a lock inside the database, whose
        one writer a lock held across many write transactions would keep from others."""
        path = f"{self.path}-{check_lock_name(name)}.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreError(f"cannot open the lock file {path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        held = _FileLock(fd, self)
        with self._lock:
            self._locks.add(held)
        return held

    # -- producer ---------------------------------------------------------------------
    def enqueue_many(self, jobs: Sequence[NewJob], *, now: float | None = None) -> list[EnqueueResult]:
        if not jobs:
            return []
        with self._group_lock:
            group = self._group
            lead = group is None
            if group is None:
                group = self._group = _Group()
            index = len(group.calls)
            group.calls.append((jobs, now))
        if lead:
            self._write_group(group)
        else:
            group.done.wait()
        result = group.results[index]
        if isinstance(result, BaseException):
            raise result
        return result

    def _write_group(self, group: _Group) -> None:
        """Write a group's enqueues in one transaction, each call in a savepoint of its own: one
        refused (QueueFull) leaves the others written."""
        results: list[list[EnqueueResult] | BaseException] = []
        try:
            with self._write(None) as (conn, t):
                with self._group_lock:  # the lock is ours: a call from now on starts the next group
                    self._group = None
                alone = len(group.calls) == 1
                for jobs, now in group.calls:
                    if alone:  # no savepoint needed: a failure rolls the transaction back
                        results.append(_enqueue_in(conn, jobs, t if now is None else now))
                        continue
                    conn.execute("SAVEPOINT enqueue")
                    try:
                        results.append(_enqueue_in(conn, jobs, t if now is None else now))
                    except Exception as exc:
                        conn.execute("ROLLBACK TO enqueue")
                        results.append(_translate(exc, "write failed, nothing was changed")
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

    def cron_enqueue(self, schedule: str, tick: float, job: NewJob | None, *,
                     now: float | None = None) -> EnqueueResult | None:
        with self._write(now) as (conn, t):
            if conn.execute(Q["cron_take"], {"name": schedule, "tick": tick, "now": t}).rowcount != 1:
                return None
            if job is None:
                return None
            [result] = _enqueue_in(conn, [job], t)  # QueueFull here rolls the tick back too
        if result.created:
            self._signal.fire()
        return result

    def cron_ticks(self) -> dict[str, float]:
        return {r["name"]: r["last_tick"] for r in self._read(Q["cron_ticks"])}

    def record_step(self, job_id: int, step: str, result: str | None, *, uid: str | None) -> tuple[bool, str | None]:
        path = _step_path(step)
        with self._write(None) as (conn, _):
            params = {"id": job_id, "path": path, "result": "null" if result is None else result, "uid": uid}
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
            return _claim_in(conn, t, queue, limit, worker_id, lease_s, start, claim_id)

    def ack_and_claim(
        self, acks: Sequence[tuple[Lease, str | None]], queue: str, limit: int, *,
        worker_id: str, lease_s: float, now: float | None = None, start: int | None = None,
    ) -> tuple[list[bool], list[Job]]:
        """One transaction: a commit (and its fsync under synchronous=full) for both."""
        with self._write(now) as (conn, t):
            held = _ack_in(conn, t, acks)
            jobs = _claim_in(conn, t, queue, limit, worker_id, lease_s, start, new_claim_id()) if limit > 0 else []
        return held, jobs

    def release_claim(self, queue: str, claim_id: str, *, now: float | None = None) -> list[int]:
        check_claim_id(claim_id)
        with self._write(now) as (conn, _):
            rows = conn.execute(Q["release_claim"], {"queue": queue, "claim_id": claim_id}).fetchall()
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
                    Q["heartbeat"], {"id": lease.job_id, "token": lease.token, "now": t, "lease_s": lease_s,
                                     "held": lease.job_id in held}
                )
                if cur.rowcount != 1:
                    lost.add(lease.job_id)
        return lost

    def ack(self, lease: Lease, result: str | None, *, now: float | None = None) -> None:
        with self._write(now) as (conn, t):
            cur = conn.execute(Q["ack"], {"id": lease.job_id, "token": lease.token, "now": t, "result": result})
            if cur.rowcount != 1:
                raise LeaseLost(lease.job_id, "ack refused")

    def ack_many(self, acks: Sequence[tuple[Lease, str | None]], *, now: float | None = None) -> list[bool]:
        if not acks:
            return []
        with self._write(now) as (conn, t):
            return _ack_in(conn, t, acks)

    def retry(self, lease: Lease, error: ErrorInfo, *, delay: float, now: float | None = None) -> JobState:
        with self._write(now) as (conn, t):
            row = conn.execute(
                Q["retry"],
                {
                    "id": lease.job_id, "token": lease.token, "now": t, "delay": max(float(delay), 0.0),
                    "keep_errors": KEEP_ERRORS, "error": self._error_json(conn, lease, error, t),
                },
            ).fetchone()
            if row is None:
                raise LeaseLost(lease.job_id, "retry refused")
            state = JobState(row[0])
        if state is JobState.AVAILABLE:
            self._signal.fire()
        return state

    def kill(self, lease: Lease, error: ErrorInfo, *, now: float | None = None) -> None:
        with self._write(now) as (conn, t):
            cur = conn.execute(
                Q["kill"],
                {
                    "id": lease.job_id, "token": lease.token, "now": t,
                    "keep_errors": KEEP_ERRORS, "error": self._error_json(conn, lease, error, t),
                },
            )
            if cur.rowcount != 1:
                raise LeaseLost(lease.job_id, "kill refused")

    @staticmethod
    def _error_json(conn: sqlite3.Connection, lease: Lease, error: ErrorInfo, t: float) -> str:
        row = conn.execute("SELECT attempt, worker_id FROM conveyor_jobs WHERE id = ?", (lease.job_id,)).fetchone()
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
        result = ReapResult(
            requeued=sorted(r["id"] for r in rows if r["state"] == "available"),
            dead=sorted(r["id"] for r in rows if r["state"] == "dead"),
        )
        if result.requeued:
            self._signal.fire()
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
                deleted += conn.execute(
                    Q["prune"], {"state": str(state), "before": t - older_than, "limit": left}
                ).rowcount
            conn.execute(Q["prune_fair_tags"], {"limit": limit})
            conn.execute(Q["prune_rate_claims"], {"now": t, "limit": limit})
        return deleted

    # -- inspection and administration ------------------------------------------------
    def get(self, job_id: int) -> Job | None:
        rows = self._read(Q["get"], {"id": job_id})
        return _row_to_job(rows[0]) if rows else None

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
        jobs = [_row_to_job(r) for r in rows[:limit]]
        return Page(jobs=jobs, next_cursor=jobs[-1].id if len(rows) > limit and jobs else None)

    def stats(self, *, now: float | None = None, worker_ttl: float = 60.0, finished: bool = True) -> Stats:
        with self._using() as conn:
            return self._stats(conn, now, worker_ttl, finished)

    def _stats(self, conn: sqlite3.Connection, now: float | None, worker_ttl: float, finished: bool) -> Stats:
        try:
            conn.execute("BEGIN")  # one consistent snapshot for every number
            try:
                t = now if now is not None else conn.execute(Q["now"]).fetchone()[0]
                counts = conn.execute(Q["count_by_state" if finished else "count_unfinished"]).fetchall()
                due = conn.execute(Q["due_scheduled"], {"now": t}).fetchall()
                oldest = conn.execute(Q["oldest_available"]).fetchall()
                counters = conn.execute(Q["counters"]).fetchall()
                expired = conn.execute(Q["expired_leases"], {"now": t}).fetchall()
                workers = conn.execute(Q["workers"], {"since": t - worker_ttl}).fetchall()
            finally:
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise _translate(exc, "stats failed") from exc

        queues = queue_stats_from_rows(t, counts, due, oldest, counters, expired)
        return Stats(
            now=t,
            queues=queues,
            workers=[
                WorkerInfo(
                    id=w["id"], queues=json.loads(w["queues"]), concurrency=w["concurrency"], host=w["host"],
                    pid=w["pid"], started_at=w["started_at"], last_seen=w["last_seen"], running=w["running"],
                    stuck=w["stuck"],
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
            _FairTags(conn).retag(back)
        if back:
            self._signal.fire()
        return len(back)

    def purge(self, *, state: JobState = JobState.DEAD, queue: str | None = None,
              job_ids: Sequence[int] | None = None) -> int:
        state = JobState(state)
        if not state.is_final:
            raise ValueError(f"purge only deletes finished jobs, not {state}")
        check_filters(queue=queue)
        sql = "DELETE FROM conveyor_jobs WHERE state = :state AND (:queue IS NULL OR queue = :queue)"
        with self._write(None) as (conn, _):
            if job_ids is None:
                return conn.execute(sql, {"state": str(state), "queue": queue}).rowcount
            return sum(
                conn.execute(sql + " AND id = :id", {"state": str(state), "queue": queue, "id": i}).rowcount
                for i in job_ids
            )

    def cancel(self, job_id: int, *, now: float | None = None) -> bool:
        with self._write(now) as (conn, t):
            return bool(conn.execute(Q["cancel"], {"id": job_id, "now": t}).rowcount)

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
        placeholders = ",".join("?" * len(queues))
        ready_sql = (
            f"SELECT EXISTS (SELECT 1 FROM conveyor_jobs WHERE state = 'available' AND queue IN ({placeholders}))"
            f" OR EXISTS (SELECT 1 FROM conveyor_jobs WHERE state = 'scheduled' AND queue IN ({placeholders})"
            f" AND run_at <= (julianday('now') - 2440587.5) * 86400.0)"
        )
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self._closed:
                return True  # closed under us: a wake-up (the next call says it is closed)
            with self._signal.cond:
                if self._signal.generation != generation:
                    return True
                self._signal.cond.wait(min(remaining, self.poll_step))
                if self._signal.generation != generation:
                    return True
            try:
                with self._using() as conn:
                    current = (conn, conn.execute("PRAGMA data_version").fetchone()[0])
                    tick = time.monotonic()
                    if current != seen or tick >= next_due_check:
                        # Another process committed something (or time passed): look before
                        # claiming, so idle workers don't take the write lock for nothing.
                        seen = current
                        next_due_check = tick + self.due_check_interval
                        if conn.execute(ready_sql, [*queues, *queues]).fetchone()[0]:
                            return True
            except StoreError:
                if self.closed:  # closed under us (a race with the check above): a wake-up too
                    return True
                raise

    def wake(self) -> None:
        """Wake this process's idle waiters (used on shutdown)."""
        self._signal.fire()

    # -- workers ----------------------------------------------------------------------
    def record_worker(self, info: WorkerInfo, *, now: float | None = None) -> None:
        with self._write(now) as (conn, t):
            conn.execute(
                Q["record_worker"],
                {
                    "id": info.id, "queues": json.dumps(info.queues), "concurrency": info.concurrency,
                    "host": info.host, "pid": info.pid, "started_at": info.started_at, "now": t,
                    "running": info.running, "stuck": info.stuck,
                },
            )
            # Rows of workers gone for a day are only noise.
            conn.execute(Q["forget_workers"], {"before": t - 86400})

    def remove_worker(self, worker_id: str) -> None:
        with self._write(None) as (conn, _):
            conn.execute(Q["remove_worker"], {"id": worker_id})


def _check_depth(conn: sqlite3.Connection, jobs: Sequence[NewJob], results: Sequence[EnqueueResult]) -> None:
    for queue, limit in sorted(depth_limits(jobs).items()):
        refuse_overflow(queue, limit, conn.execute(Q["depth"], {"queue": queue}).fetchone()[0], jobs, results)


def _enqueue_in(conn: sqlite3.Connection, jobs: Sequence[NewJob], t: float) -> list[EnqueueResult]:
    """Write the batch in the caller's open transaction (which rolls it all back on QueueFull)."""
    results: list[EnqueueResult] = []
    tags = _FairTags(conn)
    uids = new_uids(len(jobs))
    if all(job.unique_key is None for job in jobs):
        rows = [_insert_values(job, t, tags.take(job.queue, job.priority, job.fair_key), uid)
                for job, uid in zip(jobs, uids, strict=True)]
        conn.executemany(Q["insert"], rows)
        # One writer holds the lock and ids are AUTOINCREMENT: the batch is consecutive.
        last = conn.execute("SELECT last_insert_rowid()").fetchone()[0]
        first = last - len(rows) + 1
        results = [EnqueueResult(first + i, True, t, uid) for i, uid in enumerate(uids)]
    else:
        for job, uid in zip(jobs, uids, strict=True):
            if job.unique_key is None:
                cur = conn.execute(Q["insert"], _insert_values(job, t, tags.take(job.queue, job.priority, job.fair_key),
                                                               uid))
                assert cur.lastrowid is not None
                results.append(EnqueueResult(cur.lastrowid, True, t, uid))
                continue
            done = conn.execute(Q["unique_done"], {"unique_key": job.unique_key, "now": t}).fetchone()
            if done is not None:
                results.append(EnqueueResult(done[0], False, t))
                continue
            values = _insert_values(job, t, tags.peek(job.queue, job.priority, job.fair_key), uid)
            row = conn.execute(Q["insert_unique"], values).fetchone()
            if row is not None:
                tags.take(job.queue, job.priority, job.fair_key)
                results.append(EnqueueResult(row[0], True, t, uid))
            else:
                existing = conn.execute(Q["find_unique"], {"unique_key": job.unique_key}).fetchone()
                results.append(EnqueueResult(existing[0], False, t))
    tags.save()
    _check_depth(conn, jobs, results)
    return results


def _claim_in(conn: sqlite3.Connection, t: float, queue: str, limit: int, worker_id: str,
              lease_s: float, start: int | None, claim_id: str) -> list[Job]:
    conn.execute(Q["promote_queue"], {"queue": queue, "now": t, "limit": 1000})
    params = {"queue": queue, "limit": limit, "now": t, "worker_id": worker_id, "lease_s": lease_s,
              "claim_id": claim_id}
    # Fast path: claim the head of the queue; if limits apply to any of it, undo that and pick
    # job by job.
    conn.execute("SAVEPOINT claim")
    rows = conn.execute(Q["claim"], params).fetchall()
    if any(r["concurrency_key"] is not None or r["rate_key"] is not None for r in rows):
        conn.execute("ROLLBACK TO claim")
        rows = _claim_limited(conn, params)
    conn.execute("RELEASE claim")
    _raise_vtime(conn, queue, rows)
    rows.sort(key=lambda r: (r["priority"], r["fair_tag"], r["run_at"], r["id"]))
    if start is not None and start < len(rows):
        conn.execute(Q["hold"], {"ids": json.dumps([r["id"] for r in rows[max(start, 0):]])})
    return [_row_to_job(r) for r in rows]


def _ack_in(conn: sqlite3.Connection, t: float, acks: Sequence[tuple[Lease, str | None]]) -> list[bool]:
    return [
        conn.execute(Q["ack"], {"id": lease.job_id, "token": lease.token, "now": t, "result": result}).rowcount == 1
        for lease, result in acks
    ]


def _claim_limited(conn: sqlite3.Connection, params: dict[str, Any]) -> list[sqlite3.Row]:
    """Claim in queue order, passing over jobs whose concurrency or rate limit is reached."""
    limit, t = params["limit"], params["now"]
    running: dict[str, int] = {}
    recent: dict[tuple[str, float], int] = {}
    chosen: list[sqlite3.Row] = []
    seen, page = 0, limit
    while len(chosen) < limit and seen < CLAIM_SCAN:
        batch = conn.execute(Q["claim_candidates"], {
            "queue": params["queue"], "limit": min(page, CLAIM_SCAN - seen), "offset": seen,
        }).fetchall()
        seen += len(batch)
        for row in batch:
            if len(chosen) >= limit:
                break
            ckey, rkey = row["concurrency_key"], row["rate_key"]
            if ckey is not None:
                if ckey not in running:
                    running[ckey] = conn.execute(Q["running_with_key"], {"key": ckey}).fetchone()[0]
                if running[ckey] >= row["concurrency_limit"]:
                    continue
            if rkey is not None:
                window = (rkey, row["rate_period"])
                if window not in recent:
                    recent[window] = conn.execute(
                        Q["rate_claims"], {"key": rkey, "since": t - row["rate_period"]}).fetchone()[0]
                    recent[window] += sum(1 for c in chosen if c["rate_key"] == rkey)
                if recent[window] >= row["rate_limit"]:
                    continue
                for w in recent:
                    if w[0] == rkey:
                        recent[w] += 1
            if ckey is not None:
                running[ckey] += 1
            chosen.append(row)
        if len(batch) < page:
            break
        page = max(page, 200)  # past the head, look further in bigger steps
    if not chosen:
        return []
    rows = conn.execute(Q["claim_ids"], {**params, "ids": json.dumps([r["id"] for r in chosen])}).fetchall()
    conn.executemany(Q["add_rate_claim"], [
        {"key": r["rate_key"], "now": t, "expires_at": t + r["rate_period"], "id": r["id"]}
        for r in rows if r["rate_key"] is not None
    ])
    return rows


def _raise_vtime(conn: sqlite3.Connection, queue: str, rows: Sequence[sqlite3.Row]) -> None:
    top: dict[int, int] = {}
    for r in rows:
        top[r["priority"]] = max(top.get(r["priority"], 0), r["fair_tag"])
    conn.executemany(Q["raise_vtime"], [{"queue": queue, "priority": p, "vtime": v} for p, v in top.items()])


class _FairTags:
    """Fair tags for one transaction (start-time fair queuing per (queue, priority), see
    backends/base.py): for new jobs at enqueue and for dead jobs coming back by redrive."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._vtime: dict[tuple[str, int], int] = {}
        self._last: dict[tuple[str, int, str], int] = {}
        self._dirty: set[tuple[str, int, str]] = set()

    def _vt(self, queue: str, priority: int) -> int:
        if (queue, priority) not in self._vtime:
            row = self._conn.execute(Q["vtime"], {"queue": queue, "priority": priority}).fetchone()
            self._vtime[(queue, priority)] = row[0] if row else 0
        return self._vtime[(queue, priority)]

    def peek(self, queue: str, priority: int, fair_key: str | None) -> int:
        if fair_key is None:
            return self._vt(queue, priority) + 1
        key = (queue, priority, fair_key)
        if key not in self._last:
            row = self._conn.execute(
                Q["last_tag"], {"queue": queue, "priority": priority, "fair_key": fair_key}).fetchone()
            self._last[key] = row[0] if row else 0
        return max(self._last[key], self._vt(queue, priority)) + 1

    def take(self, queue: str, priority: int, fair_key: str | None) -> int:
        tag = self.peek(queue, priority, fair_key)
        if fair_key is not None:
            self._last[(queue, priority, fair_key)] = tag
            self._dirty.add((queue, priority, fair_key))
        return tag

    def save(self) -> None:
        self._conn.executemany(Q["set_last_tag"], [
            {"queue": q, "priority": p, "fair_key": k, "last_tag": self._last[(q, p, k)]}
            for q, p, k in sorted(self._dirty)
        ])

    def retag(self, rows: Sequence[sqlite3.Row]) -> None:
        """Jobs back from the dead-letter queue join the current round, as new jobs do."""
        self._conn.executemany(Q["set_fair_tag"], [
            {"id": r["id"], "fair_tag": self.take(r["queue"], r["priority"], r["fair_key"])} for r in rows
        ])
        self.save()


def _step_path(step: str) -> str:
    if not isinstance(step, str) or not NAME_RE.fullmatch(step):
        raise InvalidName(f"step name must match {NAME_RE.pattern}, got {step!r}")
    return f'$."{step}"'


def _insert_values(job: NewJob, t: float, fair_tag: int, uid: str) -> tuple[Any, ...]:
    """The values of the insert statements, in their order."""
    run_at = job.run_at if job.run_at is not None else t + max(job.delay, 0.0)
    return (
        job.queue, job.task, job.args, "scheduled" if run_at > t else "available", job.priority, run_at,
        job.max_attempts, job.timeout, job.unique_key, job.meta, t, job.fair_key, fair_tag, job.unique_for,
        job.concurrency_key, job.concurrency_limit, job.rate_key, job.rate_limit, job.rate_period, uid,
    )


def _row_to_job(row: sqlite3.Row) -> Job:
    return make_job(
        id=row["id"], task=row["task"], queue=row["queue"], args=json.loads(row["args"]),
        state=JobState(row["state"]), attempts=row["attempt"], max_attempts=row["max_attempts"],
        priority=row["priority"], run_at=row["run_at"], timeout=row["timeout_s"],
        created_at=row["created_at"], uid=row["uid"], attempted_at=row["attempted_at"], finished_at=row["finished_at"],
        result=json.loads(row["result"]) if row["result"] is not None else None,
        errors=json.loads(row["errors"]), unique_key=row["unique_key"], worker_id=row["worker_id"],
        lease_token=row["lease_token"], lease_expires_at=row["lease_expires_at"], meta=json.loads(row["meta"]),
        fair_key=row["fair_key"], steps=json.loads(row["steps"]),
        concurrency_key=row["concurrency_key"], concurrency_limit=row["concurrency_limit"],
        rate_key=row["rate_key"], rate_limit=row["rate_limit"], rate_period=row["rate_period"],
        stalls=row["stalls"],
    )


def _translate(exc: sqlite3.Error, what: str) -> StoreError:
    text = str(exc)
    if "full" in text.lower():
        return StorageFull(f"SQLite: {what}: {text} (free disk space; nothing was written)")
    return StoreError(f"SQLite: {what}: {text}")


class _FileLock(StoreLock):
    """An open file with an exclusive ``flock``: closing the file lets go of it."""

    def __init__(self, fd: int, owner: SqliteBackend) -> None:
        self._fd: int | None = fd
        self._owner = owner
        self._mutex = threading.Lock()

    def renew(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        with self._mutex:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        with self._owner._lock:
            self._owner._locks.discard(self)
