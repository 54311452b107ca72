"""PostgreSQL backend: many machines against one database.

Claims are one ``FOR NO KEY UPDATE SKIP LOCKED`` statement, batched to the worker's free slots;
idle workers sleep on ``LISTEN`` and are woken by ``pg_notify`` from the transaction that
made a job available, with polling as the fallback. Jobs can be enqueued inside the
caller's own transaction, and a task can complete its job (and record its exactly-once
steps) in the transaction that holds its own writes.

Fair sharing keeps its state in two small tables: ``conveyor_queue_clock`` (each queue's
virtual time, raised by the claim statement itself) and ``conveyor_fair_tags`` (each fair
key's last tag, reserved at enqueue by an upsert whose row lock orders concurrent enqueues).

Concurrency and rate limits (backends/base.py) cost nothing while the head of a queue has no
limited jobs: the one claim statement claims nothing if any job it picked has a limit, and
then a second transaction takes the limited path. That path reads the waiting jobs in claim
order without locking them (at most ``CLAIM_SCAN``), takes a transaction-scoped advisory lock
per limit key with ``pg_try_advisory_xact_lock`` (a key another claimer holds is passed over
this round: nobody waits, so nobody deadlocks), counts running jobs and recent claims per key
in the next statement (READ COMMITTED: it sees the previous holder's commit), and claims the
admitted jobs with ``SKIP LOCKED``, recording a ``conveyor_rate_claims`` row per claim of a
rate-limited job in the same statement. A job with a concurrency key that leaves ``running``
wakes idle workers of its queue. A queue whose head was limited keeps taking the limited path
until a claim there finds no limited job among those it looked at.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import json
import logging
import os
import re
import select
import socket
import threading
import time
from collections import Counter
from collections.abc import Collection, Generator, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import errors as pgerrors
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from ..errors import (
    ConfigurationError,
    InvalidName,
    JobNotFound,
    LeaseLost,
    StorageFull,
    StoreError,
    StoreUnavailable,
)
from ..job import Job, JobState, make_job
from ..payload import NAME_RE
from . import forking, redact_url
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
    queue_stats_from_rows,
    refuse_overflow,
)
from .pg_migrate import LATEST as SCHEMA_VERSION
from .pg_migrate import migrate as migrate_schema
from .sql import load_queries

log = logging.getLogger("conveyor.postgres")

NOW = "coalesce(to_timestamp(%(now)s::float8), now())"
# The time the statement started, for the limited claim: later than the transaction's now().
STMT_NOW = "coalesce(to_timestamp(%(now)s::float8), statement_timestamp())"
# A job row's columns, named: a statement returning ``j.*`` is prepared with the table's shape,
# and PostgreSQL refuses it once a later release's migration adds a column ("cached plan must
# not change result type"), which would stop every running worker of the old release.
JOB_COLUMNS = ("id", "queue", "task", "state", "priority", "run_at", "attempt", "max_attempts",
               "timeout_s", "lease_token", "lease_expires_at", "worker_id", "unique_key", "errors",
               "meta", "created_at", "attempted_at", "finished_at", "fair_key", "fair_tag",
               "unique_for", "concurrency_key", "concurrency_limit", "rate_key", "rate_limit",
               "rate_period", "args", "result", "uid", "stalls")


def _job_columns(sql: str) -> str:
    """``:JOB(alias)`` becomes ``alias.id, alias.queue, ...``."""
    return re.sub(r":JOB\((\w+)\)", lambda m: ", ".join(f"{m[1]}.{c}" for c in JOB_COLUMNS), sql)


Q = {name: _job_columns(sql.replace(":NOW", NOW).replace(":STMT_NOW", STMT_NOW))
     for name, sql in load_queries("postgres").items()}
KEEP_ERRORS = 20
CHANNEL = "conveyor_wake"
DEPTH_LOCK = "SELECT pg_advisory_xact_lock(hashtext('conveyor_depth:' || current_schema() || ':' || %s))"
# A plain job's enqueue (see _plain): the insert, and its wake-up delivered at the same commit.
ENQUEUE_ONE = ("WITH ins AS (" + Q["insert"].strip().rstrip(";") + ")\n"
               "SELECT ins.id, ins.uid, ins.at, pg_notify(%(channel)s, %(queue)s) FROM ins").encode()
DRAIN_AT_ONCE = 10_000  # notifications an idle wait reads before it looks (a bound under a flood)
TRY_LOCK = "SELECT pg_try_advisory_lock(hashtextextended(%s || current_schema(), 0)) AS held"
UNIQUE_RACE_TRIES = 3  # a unique key that changes hands between insert and lookup is tried again

# Every network call has a bound: connecting, each statement, a dead peer (tcp_user_timeout).
CONNECT_DEFAULTS = {
    "connect_timeout": "5",
    "application_name": "conveyor",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",
}
STATEMENT_TIMEOUT_MS = 30_000
POOL_TIMEOUT = 5.0  # longest wait for a connection: an outage surfaces as StoreError this soon
RECOVER_S = 2.0  # how long a claimer whose reply was lost keeps trying to give the claim back
# The main pool's size beyond the task slots of the workers in this process (each slot may hold
# a connection in transaction()): room for producers, the app's own calls and the dashboard.
POOL_ROOM = 10
POOL_PARAMS = ("pool_min_size", "pool_max_size")  # read from the store URL, not given to libpq
# The control pool's size per worker: its claim, heartbeat and maintenance threads at once.
CONTROL_SIZE = 4
REPLACE_WAIT = 1.0  # longest wait for the pool to replace a dead connection before it may grow
ASK_EVERY = 0.5  # a wait for a connection asks the pool again this often (see _pooled)
# Connections above min_size idle this long are closed (one per period; psycopg's default is
# 10 min): a pool that grew while sessions were being killed comes back to its working size.
MAX_IDLE = 60.0
# The client's own deadline on a connection: statement_timeout plus this. statement_timeout is
# enforced by the server, so it never fires when the server, or the path to it, stops answering
# (keepalives and tcp_user_timeout see a healthy peer behind a proxy or a stuck server). The
# margin lets the server's own timeout, which keeps the connection, win when the server is there.
DEADLINE_MARGIN_S = 0.5


def _statement_budget() -> float:
    """How long one call may use a connection: statement_timeout + the margin."""
    return STATEMENT_TIMEOUT_MS / 1000 + DEADLINE_MARGIN_S


def _call_budget() -> float:
    """How long one call may take in all: waiting for a connection, then using it."""
    return max(POOL_TIMEOUT, STATEMENT_TIMEOUT_MS / 1000) + DEADLINE_MARGIN_S


class _Deadline:
    """One armed deadline on a connection (an entry of the watchdog's heap)."""

    __slots__ = ("at", "conn", "done", "fired")

    def __init__(self, at: float, conn: Any) -> None:
        self.at = at
        self.conn = conn
        self.done = False  # disarmed in time: the heap entry is stale
        self.fired = False  # expired: the connection's socket was shut down


class _Watchdog:
    """Client-side deadlines for every PostgreSQL connection of the process, kept by one thread.

    ``arm`` pushes (deadline, connection) on a heap, O(log n); ``disarm`` only marks the entry
    (stale entries are popped when they reach the top, or swept once they are most of the heap).
    When a deadline passes, the thread shuts the connection's socket down: the blocked call
    wakes at once with an OperationalError and the connection is dead, so it is discarded. A
    cancel request (``cancel_safe``) would not do: it travels the same dead path, and leaves
    the connection waiting for a reply that may never come."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, _Deadline]] = []
        self._seq = itertools.count()
        self._stale = 0
        self._thread: threading.Thread | None = None

    def arm(self, conn: Any, at: float) -> _Deadline:
        entry = _Deadline(at, conn)
        with self._cond:
            heapq.heappush(self._heap, (at, next(self._seq), entry))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="conveyor-pg-deadlines", daemon=True)
                self._thread.start()
            elif self._heap[0][2] is entry:
                self._cond.notify()  # earlier than what the thread sleeps until
        return entry

    def disarm(self, entry: _Deadline) -> bool:
        """Whether the deadline fired (then the connection is dead)."""
        with self._cond:
            if not entry.fired:
                entry.done = True
                entry.conn = None
                self._stale += 1
                if self._stale > 256 and self._stale * 2 > len(self._heap):
                    self._heap = [e for e in self._heap if not e[2].done]
                    heapq.heapify(self._heap)
                    self._stale = 0
            return entry.fired

    def _run(self) -> None:
        with self._cond:
            while True:
                heap = self._heap
                while heap and heap[0][2].done:
                    heapq.heappop(heap)
                    self._stale -= 1
                if not heap:
                    self._cond.wait()
                    continue
                wait = heap[0][0] - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                entry = heapq.heappop(heap)[2]
                entry.fired = True
                conn, entry.conn = entry.conn, None
                # Under the lock: the owner cannot disarm and close the connection (freeing its
                # descriptor for reuse) while its socket is being shut down.
                _shut_down(conn)

    def _after_fork(self) -> None:
        # A forked child has no watchdog thread, and the parent's deadlines are not its own.
        self._cond = threading.Condition(threading.Lock())
        self._heap = []
        self._stale = 0
        self._thread = None


def _shut_down(conn: Any) -> None:
    try:
        fd = conn.pgconn.socket
        sock = socket.socket(fileno=os.dup(fd))
    except (psycopg.Error, OSError):
        return  # closed already
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()
    log.warning("PostgreSQL did not answer in time: connection shut down")


_WATCHDOG = _Watchdog()
os.register_at_fork(after_in_child=_WATCHDOG._after_fork)


class _Guard:
    """``with _Guard(conn, at):`` the connection is shut down if the block is still running at
    ``at`` (time.monotonic()); the block's driver error then becomes :class:`StoreUnavailable`
    (unless ``translate`` is false). With ``close``, a connection whose deadline fired is closed
    on the way out (so a pool drops it). A block that finished anyway keeps its result."""

    __slots__ = ("_budget", "_close", "_conn", "_entry", "_translate")

    def __init__(self, conn: Any, at: float, *, close: bool = False, translate: bool = True) -> None:
        self._conn = conn
        self._close = close
        self._translate = translate
        self._budget = at - time.monotonic()
        self._entry = _WATCHDOG.arm(conn, at)

    @property
    def fired(self) -> bool:
        return self._entry.fired

    def __enter__(self) -> _Guard:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if not _WATCHDOG.disarm(self._entry):
            return
        if self._close and isinstance(self._conn, psycopg.Connection):
            with suppress(psycopg.Error):
                self._conn.close()
        if self._translate and isinstance(exc, psycopg.Error):
            raise StoreUnavailable(
                f"PostgreSQL did not answer within {max(self._budget, 0.0):.1f}s (server or network "
                "stalled); the connection was dropped and the call abandoned: it may or may not "
                "have taken effect") from exc


def _bounded(conn: Any, *, close: bool = False) -> _Guard:
    """A guard for one call on a connection: statement_timeout + the margin from now."""
    return _Guard(conn, time.monotonic() + _statement_budget(), close=close)


def _quiet(conn: psycopg.Connection[Any]) -> bool:
    """An idle connection with nothing waiting on its socket. A terminated backend or a server
    that went away leaves an error message or an end of file there, so only a connection whose
    socket is readable needs the probe's round trip (pool connections never LISTEN, so nothing
    else arrives unasked)."""
    try:
        if conn.info.transaction_status != TransactionStatus.IDLE:
            return False
        return not select.select([conn.pgconn.socket], [], [], 0)[0]
    except (psycopg.Error, OSError, ValueError):
        return False


def _configure(conn: psycopg.Connection[Any]) -> None:
    # A pool's worker runs this on each new connection: bounded too, or a stall right after
    # connecting would hold that worker for ever.
    with _Guard(conn, time.monotonic() + _statement_budget(), close=True, translate=False):
        conn.execute(f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}")
        conn.execute("SET idle_in_transaction_session_timeout = 60000")


@contextmanager
def _pooled(pool: ConnectionPool[Any], until: float) -> Iterator[Any]:
    """``pool.connection()``, waiting up to ``until`` (monotonic).

    psycopg_pool stops reconnecting after ``reconnect_timeout``, and only a *new* request makes
    it try again: a request already waiting would sit out its whole timeout though the server
    is back (a server frozen past the reconnect timeout: every heartbeat then failed for up to
    POOL_TIMEOUT after it thawed). So wait in turns of ASK_EVERY, each one a new request. While
    the pool is growing, a new request starts nothing more (it grows one connection at a time);
    otherwise, below max_size, it may start one connection, as the first request did."""
    while True:
        try:
            conn = pool.getconn(timeout=min(until - time.monotonic(), ASK_EVERY))
            break
        except PoolTimeout:
            if until - time.monotonic() <= 0:
                raise
    try:
        with conn:
            yield conn
    finally:
        pool.putconn(conn)


def _await_idle(pool: ConnectionPool[Any], until: float) -> None:
    """Wait, up to REPLACE_WAIT, until the pool holds an idle connection (dead or alive).

    After a dead one went back, the pool is already replacing it. Asking for a connection
    while it has none idle would make it *grow* by one more on top of that replacement, so each
    storm of killed sessions would leave it one larger, up to max_size. Past REPLACE_WAIT (the
    server is down, or every connection is busy) the caller queues in the pool as usual, which
    may grow it."""
    until = min(until, time.monotonic() + REPLACE_WAIT)
    pause = 0.001
    while pool.get_stats().get("pool_available", 0) == 0 and time.monotonic() < until:
        time.sleep(min(pause, max(0.0, until - time.monotonic())))
        pause = min(pause * 2, 0.05)


def _fresh_pool(old: ConnectionPool[Any], max_size: int) -> ConnectionPool[Any]:
    """A pool like ``old``, not opened yet, for a forked child."""
    return ConnectionPool(
        conninfo=old.conninfo, kwargs=old.kwargs, min_size=old.min_size, max_size=max(max_size, old.min_size),
        open=False, timeout=old.timeout, reconnect_timeout=old.reconnect_timeout, configure=_configure,
        name=old.name, max_idle=old.max_idle,
    )


class PostgresBackend(Backend):
    supports_transactions = True  # enqueue/ack can join a caller's transaction
    _pools_pending = False  # a forked child's pools are opened on first use

    def __init__(self, url: str, *, min_size: int | None = None, max_size: int | None = None) -> None:
        """``max_size`` (or ``?pool_max_size=`` in the URL) fixes the main pool's size; unset, it is
        POOL_ROOM plus the task slots of the workers running in this process (reserve_connections)."""
        self.url = url
        url, sizes = _pool_sizes(url)
        min_size = min_size if min_size is not None else sizes.get("pool_min_size", 1)
        self._fixed_size = max_size if max_size is not None else sizes.get("pool_max_size")
        if min_size < 0 or (self._fixed_size is not None and self._fixed_size < max(min_size, 1)):
            raise ConfigurationError(f"PostgreSQL pool sizes: need 0 <= pool_min_size <= pool_max_size, "
                                     f"pool_max_size >= 1; got {min_size} and {self._fixed_size}")
        self._reserved = 0  # task slots of the workers running on this backend
        self._workers = 0  # and how many workers they are
        self._size_lock = threading.Lock()
        try:
            params = conninfo_to_dict(url)
        except psycopg.ProgrammingError as exc:
            raise ConfigurationError(f"invalid PostgreSQL URL: {exc}") from None
        for key, value in CONNECT_DEFAULTS.items():
            params.setdefault(key, value)
        self._params = params
        self._conninfo = make_conninfo("", **params)
        try:
            # One direct attempt first: a wrong host, role or password fails now, with
            # the server's words, instead of after the pool's retries time out.
            psycopg.connect(self._conninfo).close()
        except psycopg.Error as exc:
            raise StoreError(f"PostgreSQL: cannot connect to {redact_url(url)}: {str(exc).strip()}") from None
        self._pool: ConnectionPool[psycopg.Connection[dict[str, Any]]] = ConnectionPool(
            conninfo=self._conninfo, kwargs={"autocommit": True, "row_factory": dict_row},
            min_size=min_size, max_size=max(self._fixed_size or POOL_ROOM, min_size), open=False, timeout=POOL_TIMEOUT,
            # Give up reconnecting quickly: the next request then connects at once, instead of
            # waiting out the pool's exponential backoff long after the server is back.
            reconnect_timeout=5.0, configure=_configure, name="conveyor", max_idle=MAX_IDLE,
        )
        # The worker's own transitions (claim, heartbeat, ack...) get a pool of their own, so
        # tasks holding connections (transaction(), enqueues) can never starve a heartbeat.
        self._control: ConnectionPool[psycopg.Connection[dict[str, Any]]] = ConnectionPool(
            conninfo=self._conninfo, kwargs={"autocommit": True, "row_factory": dict_row},
            min_size=1, max_size=CONTROL_SIZE, open=False, timeout=POOL_TIMEOUT, reconnect_timeout=5.0,
            configure=_configure, name="conveyor-control", max_idle=MAX_IDLE,
        )
        try:
            self._pool.open(wait=True, timeout=POOL_TIMEOUT)
            self._control.open(wait=True, timeout=POOL_TIMEOUT)
        except PoolTimeout as exc:
            self._pool.close()
            self._control.close()
            raise StoreError(f"PostgreSQL: cannot connect: {exc}") from None
        self._listener: psycopg.Connection[dict[str, Any]] | None = None
        self._listen_lock = threading.Lock()
        self._locks: set[_SessionLock] = set()  # store-wide locks this backend holds (try_lock)
        self._locks_mutex = threading.Lock()
        # Pool name -> until when a dead connection it took back may still be being replaced.
        self._replacing: dict[str, float] = {}
        # Queues whose last claim met limited jobs at its head: their claims go straight to the
        # limited path instead of trying the fast statement first (a hint, never a rule).
        self._limited_queues: set[str] = set()
        self._wake_generation = 0
        forking.register(self)
        self._migrate()

    # -- plumbing ---------------------------------------------------------------------
    def _after_fork_in_child(self) -> None:
        # The parent's pools and LISTEN connection are its sessions: closing them here would
        # send Terminate on them, and their pool threads are not in this process. They are
        # kept untouched (psycopg finishes a connection only in the process that opened it)
        # and this process opens its own on first use.
        forking.keep_inherited(self._pool, self._control, self._listener)
        # Its store-wide locks too: each is a session of the parent's, and the lock is the
        # parent's to free.
        forking.keep_inherited(self._locks)
        self._locks, self._locks_mutex = set(), threading.Lock()
        # The parent's workers are not in this process: the pools are sized for none yet.
        self._reserved = self._workers = 0
        self._size_lock = threading.Lock()
        self._pool = _fresh_pool(self._pool, self._fixed_size or POOL_ROOM)
        self._control = _fresh_pool(self._control, CONTROL_SIZE)
        self._listener = None
        self._listen_lock = threading.Lock()
        self._open_lock = threading.Lock()
        self._replacing = {}
        self._pools_pending = True

    def _open_pools(self) -> None:
        with self._open_lock:
            if self._pools_pending:
                # Not waiting: a server that is down makes the caller's own bounded wait fail.
                self._pool.open(wait=False)
                self._control.open(wait=False)
                self._pools_pending = False

    @contextmanager
    def _live_connection(
        self, pool: ConnectionPool[psycopg.Connection[dict[str, Any]]] | None = None, *,
        until: float | None = None, hold: bool = True,
    ) -> Iterator[psycopg.Connection[dict[str, Any]]]:
        """A pooled connection that just answered. Dead ones (killed backend, server restart)
        go back to the pool, which discards them, and we take the next: probing here instead
        of the pool's own check avoids its growing sleeps between failed checks.

        Bounded by the client's own clock: waiting for a connection by ``POOL_TIMEOUT``, and the
        whole call by ``until`` (default: now + ``_call_budget()``), using the connection by
        ``_statement_budget()`` at most. Past that, the connection is shut down and discarded
        and the call raises StoreUnavailable. With ``hold`` false only the probe is bounded (the
        caller bounds its own uses of the connection)."""
        if self._pools_pending:
            self._open_pools()
        pool = pool or self._pool
        start = time.monotonic()
        if until is None:
            until = start + _call_budget()
        wait_until = min(start + POOL_TIMEOUT, until)
        try:
            for attempt in range(pool.max_size + 1):
                if attempt or self._replacing.get(pool.name, 0.0) > time.monotonic():
                    _await_idle(pool, wait_until)
                left = wait_until - time.monotonic()
                if left <= 0:
                    raise StoreUnavailable(f"PostgreSQL: no live connection within {POOL_TIMEOUT:.1f}s "
                                           "(is the server up and answering?)")
                with _pooled(pool, wait_until) as conn:
                    try:
                        guard = _Guard(conn, min(until, time.monotonic() + _statement_budget()), close=True)
                        with guard:
                            try:
                                if not _quiet(conn):
                                    conn.execute("")
                            except psycopg.OperationalError:
                                if guard.fired:
                                    raise
                                continue
                            if hold:
                                yield conn
                                return
                        yield conn
                        return
                    finally:
                        if conn.broken or conn.closed:  # the pool replaces it when it goes back
                            self._replacing[pool.name] = time.monotonic() + REPLACE_WAIT
        except PoolTimeout as exc:
            raise StoreUnavailable(self._no_connection(pool, time.monotonic() - start, exc)) from None
        raise StoreError("PostgreSQL: no live connection in the pool (is the server up?)")

    def _no_connection(self, pool: ConnectionPool[Any], waited: float, exc: PoolTimeout) -> str:
        stats = pool.get_stats()
        text = f"PostgreSQL: no connection available after {waited:.1f}s ({exc})"
        if pool is not self._pool or stats.get("pool_size", 0) < pool.max_size or stats.get("pool_available", 0):
            return text + " (is the server up and answering?)"
        how = ("set by pool_size= / ?pool_max_size=" if self._fixed_size is not None
               else f"{POOL_ROOM} plus the task slots of this process's workers")
        return (f"{text}: all {pool.max_size} connections of the pool ({how}) are in use, by tasks "
                "holding transaction() and the app's own calls. Raise it: Conveyor(..., pool_size=N) "
                "or ?pool_max_size=N in the store URL (and keep it below the server's max_connections)")

    def reserve_connections(self, slots: int) -> list[str]:
        """A worker starts (``slots`` > 0) or stops (< 0): grow or shrink the main pool by its
        slots unless its size was fixed (then say so when it is too small for them), and the
        control pool by one worker's share."""
        with self._size_lock:
            self._reserved = max(0, self._reserved + slots)
            self._workers = max(0, self._workers + (1 if slots > 0 else -1 if slots < 0 else 0))
            # Workers sharing this backend (several in one process) each get their own share.
            self._control.resize(1, CONTROL_SIZE * max(1, self._workers))
            if self._fixed_size is None:
                self._pool.resize(self._pool.min_size, max(POOL_ROOM + self._reserved, self._pool.min_size))
                return []
            if slots > 0 and self._fixed_size < self._reserved + 1:
                return [f"PostgreSQL pool_max_size={self._fixed_size} is not above the {self._reserved} "
                        "task slots of this process's workers: tasks that hold transaction() wait for a "
                        f"connection, and fail after {POOL_TIMEOUT:g}s without one. Leave the size unset "
                        f"(it follows the workers' concurrency) or raise it"]
            return []

    @contextmanager
    def _tx(self, *, control: bool = False, until: float | None = None,
            ) -> Iterator[psycopg.Connection[dict[str, Any]]]:
        try:
            with self._live_connection(self._control if control else None, until=until) as conn, \
                    conn.transaction():
                yield conn
        except psycopg.Error as exc:
            raise _translate(exc) from exc

    def _migrate(self) -> None:
        with self._tx() as conn:
            row = conn.execute("SELECT to_regclass('conveyor_schema_migrations') IS NOT NULL AS ok").fetchone()
            if row and row["ok"]:
                done = conn.execute("SELECT max(version) AS v FROM conveyor_schema_migrations").fetchone()
                if done and done["v"] is not None and done["v"] >= SCHEMA_VERSION:
                    return
        try:
            migrate_schema(self._conninfo)
        except psycopg.Error as exc:
            raise _translate(exc) from exc

    def schema_version(self) -> int:
        with self._tx() as conn:
            row = conn.execute("SELECT max(version) AS v FROM conveyor_schema_migrations").fetchone()
        return int(row["v"]) if row and row["v"] is not None else 0

    def now(self) -> float:
        with self._tx() as conn:
            row = conn.execute(Q["stats_now"], {"now": None}).fetchone()
        assert row is not None
        return float(row["now"])

    def close(self) -> None:
        with self._listen_lock:
            if self._listener is not None:
                self._listener.close()
                self._listener = None
        with self._locks_mutex:
            locks, self._locks = self._locks, set()
        for held in locks:
            held.release()
        self._pool.close()
        self._control.close()

    def _notify(self, conn: psycopg.Connection[Any], queues: Sequence[str]) -> None:
        # Delivered at commit, so a woken worker always finds the job.
        distinct = sorted(set(queues))
        if distinct:
            conn.execute(Q["notify"], {"channel": CHANNEL, "queues": distinct})

    def _notify_freed(self, conn: psycopg.Connection[Any], rows: Sequence[dict[str, Any]]) -> None:
        """Jobs with a concurrency key left ``running``: a slot is free, so wake idle workers of
        their queues for the jobs the limit held back. Nothing at all for jobs without a key."""
        self._notify(conn, [r["queue"] for r in rows if r["concurrency_key"] is not None])

    # -- producer ---------------------------------------------------------------------
    def enqueue_many(
        self, jobs: Sequence[NewJob], *, now: float | None = None,
        connection: psycopg.Connection[Any] | None = None,
    ) -> list[EnqueueResult]:
        """With ``connection``, the jobs are written in the caller's transaction (a savepoint
        inside it): rolled back, there are no jobs; committed, there is exactly one each."""
        if not jobs:
            return []
        if connection is not None:
            try:
                with _bounded(connection):
                    _join_transaction(connection)
                    # A savepoint: the batch is all or nothing.
                    with connection.transaction(), connection.cursor(row_factory=dict_row) as cur:
                        return _run(cur, _enqueue_plan(jobs, now))
            except psycopg.Error as exc:
                raise _translate(exc) from exc
        if len(jobs) == 1 and _plain(jobs[0]):
            # The common case in one autocommit statement: the insert and its wake-up commit
            # together (the notification is delivered at that commit), one round trip instead of
            # BEGIN, insert, notify and COMMIT.
            params = {**_insert_params(jobs[0], now, None), "channel": CHANNEL}
            try:
                with self._live_connection() as conn:
                    row = conn.execute(ENQUEUE_ONE, params).fetchone()
            except psycopg.Error as exc:
                raise _translate(exc) from exc
            assert row is not None  # no unique key: the insert always writes its row
            return [EnqueueResult(row["id"], True, row["at"], row["uid"])]
        with self._tx() as conn, conn.cursor() as cur:
            return _run(cur, _enqueue_plan(jobs, now))

    async def aenqueue_many(
        self, jobs: Sequence[NewJob], *, connection: psycopg.AsyncConnection[Any], now: float | None = None,
    ) -> list[EnqueueResult]:
        """``enqueue_many`` inside the caller's transaction on an async connection."""
        if not jobs:
            return []
        try:
            with _bounded(connection):
                if not connection.autocommit and connection.info.transaction_status == TransactionStatus.IDLE:
                    await connection.execute("BEGIN")
                async with connection.transaction(), connection.cursor(row_factory=dict_row) as cur:
                    return await _arun(cur, _enqueue_plan(jobs, now))
        except psycopg.Error as exc:
            raise _translate(exc) from exc

    def cron_enqueue(self, schedule: str, tick: float, job: NewJob | None, *,
                     now: float | None = None) -> EnqueueResult | None:
        with self._tx() as conn:
            if conn.execute(Q["cron_take"], {"name": schedule, "tick": tick, "now": now}).fetchone() is None:
                return None  # this tick or a later one was taken already
            if job is None:
                return None
            with conn.cursor() as cur:
                # QueueFull raised here rolls the whole transaction back: the tick is not taken.
                [result] = _run(cur, _enqueue_plan([job], now))
        return result

    def cron_ticks(self) -> dict[str, float]:
        with self._tx() as conn:
            return {r["name"]: float(r["last_tick"]) for r in conn.execute(Q["cron_ticks"])}

    def record_step(self, job_id: int, step: str, result: str | None, *, uid: str | None,
                    connection: psycopg.Connection[Any] | None = None) -> tuple[bool, str | None]:
        """With ``connection``, the record joins that connection's open transaction (the caller
        commits): with the task's own writes, it happens exactly once."""
        _check_step_name(step)
        if connection is not None:
            try:
                with _bounded(connection), connection.cursor(row_factory=dict_row) as cur:
                    return _record_step(cur, job_id, step, result, uid)
            except psycopg.Error as exc:
                raise _translate(exc) from exc
        with self._tx() as conn, conn.cursor() as cur:
            return _record_step(cur, job_id, step, result, uid)

    # -- worker -----------------------------------------------------------------------
    def claim(
        self, queue: str, limit: int, *, worker_id: str, lease_s: float, now: float | None = None,
        start: int | None = None, claim_id: str | None = None,
    ) -> list[Job]:
        claim_id = new_claim_id() if claim_id is None else check_claim_id(claim_id)
        if limit <= 0:
            return []
        return self._ack_and_claim([], queue, limit, worker_id, lease_s, now, start, claim_id)[1]

    def _claim_limited_path(self, queue: str, limit: int, params: dict[str, Any]) -> list[Job]:
        with self._tx(control=True) as conn:
            conn.execute(Q["promote_queue"], {"queue": queue, "now": params["now"], "limit": 1000})
            rows, saw_limited = _claim_limited(conn, {**params, "limit": limit})
        if not saw_limited:
            self._limited_queues.discard(queue)  # no limits at the head any more: fast path again
        return _claimed_jobs(rows)

    def heartbeat(self, leases: Sequence[Lease], *, lease_s: float, now: float | None = None,
                  held: Collection[int] = ()) -> set[int]:
        if not leases:
            return set()
        with self._tx(control=True) as conn:
            rows = conn.execute(
                Q["heartbeat"],
                {"ids": [x.job_id for x in leases], "tokens": [x.token for x in leases], "now": now,
                 "lease_s": lease_s, "held": list(held)},
            ).fetchall()
        held = {r["id"] for r in rows}
        return {x.job_id for x in leases} - held

    def ack(self, lease: Lease, result: str | None, *, now: float | None = None,
            connection: psycopg.Connection[Any] | None = None) -> None:
        """With ``connection``, the ack joins that connection's open transaction (the caller commits)."""
        params = {"id": lease.job_id, "token": lease.token, "now": now, "result": result}
        if connection is not None:
            try:
                with _bounded(connection), connection.cursor(row_factory=dict_row) as cur:
                    row = cur.execute(Q["ack"], params).fetchone()
                    if row is not None and row["concurrency_key"] is not None:
                        # Delivered when the caller commits, as the ack itself.
                        cur.execute(Q["notify"], {"channel": CHANNEL, "queues": [row["queue"]]})
            except psycopg.Error as exc:
                raise _translate(exc) from exc
            if row is None:
                raise LeaseLost(lease.job_id, "ack refused")
            return
        with self._tx(control=True) as conn:
            row = conn.execute(Q["ack"], params).fetchone()
            if row is None:
                raise LeaseLost(lease.job_id, "ack refused")
            self._notify_freed(conn, [row])

    def ack_many(self, acks: Sequence[tuple[Lease, str | None]], *, now: float | None = None) -> list[bool]:
        if not acks:
            return []
        with self._tx(control=True) as conn:
            rows = conn.execute(
                Q["ack_many"],
                {"ids": [x.job_id for x, _ in acks], "tokens": [x.token for x, _ in acks],
                 "results": [r for _, r in acks], "now": now},
            ).fetchall()
            self._notify_freed(conn, rows)
        held = {r["id"] for r in rows}
        return [lease.job_id in held for lease, _ in acks]

    def ack_and_claim(
        self, acks: Sequence[tuple[Lease, str | None]], queue: str, limit: int, *,
        worker_id: str, lease_s: float, now: float | None = None, start: int | None = None,
    ) -> tuple[list[bool], list[Job]]:
        return self._ack_and_claim(acks, queue, limit, worker_id, lease_s, now, start, new_claim_id())

    def _ack_and_claim(
        self, acks: Sequence[tuple[Lease, str | None]], queue: str, limit: int, worker_id: str, lease_s: float,
        now: float | None, start: int | None, claim_id: str,
    ) -> tuple[list[bool], list[Job]]:
        """A claim whose reply is lost (the connection broke after it was sent) is given back
        by its claim id (release_claim) once the store answers again, so its jobs are not
        charged an attempt for it; if that fails too, they are held and come back as stalls."""
        try:
            return self._ack_and_claim_once(acks, queue, limit, worker_id, lease_s, now, start, claim_id)
        except StoreError:
            # A broken connection comes as StoreError or StoreUnavailable; either way the claim
            # may have committed unseen. Giving back a claim that never ran finds nothing.
            self._give_back_lost_claim(queue, claim_id, now)
            raise

    def _give_back_lost_claim(self, queue: str, claim_id: str, now: float | None) -> None:
        """release_claim, tried again for up to RECOVER_S while the store is away (the blip
        that lost the reply often takes the next connection too); after that the jobs come
        back when their leases run out, as held jobs, uncounted (see reap)."""
        deadline = time.monotonic() + RECOVER_S
        pause = 0.05
        while True:
            try:
                released = self.release_claim(queue, claim_id, now=now)
            except StoreError:
                if time.monotonic() + pause > deadline:
                    log.warning("a claim's reply was lost and its jobs could not be given back; "
                                "they come back when their leases run out")
                    return
                time.sleep(pause)
                pause = min(pause * 2, 0.5)
                continue
            if released:
                log.warning("a claim's reply was lost: gave its jobs back unrun: %s", released)
            return

    def _ack_and_claim_once(
        self, acks: Sequence[tuple[Lease, str | None]], queue: str, limit: int, worker_id: str, lease_s: float,
        now: float | None, start: int | None, claim_id: str,
    ) -> tuple[list[bool], list[Job]]:
        """The queue's due jobs promoted (a statement of its own, so the claim sees them in
        their place in claim order), then the acks and the claim in one statement, both in
        autocommit: two round trips and no BEGIN/COMMIT. If a limit applies at the head of
        the queue, it claims nothing and the limited path (a transaction) does."""
        if limit <= 0:
            return (self.ack_many(acks, now=now) if acks else []), []
        params = {"queue": queue, "now": now, "worker_id": worker_id, "lease_s": lease_s, "claim_id": claim_id,
                  "start": limit if start is None else max(start, 0)}
        held: list[bool] = []
        jobs: list[Job] = []
        for _ in range(2):
            if queue in self._limited_queues:
                if acks:
                    held = self.ack_many(acks, now=now)
                return held, jobs + self._claim_limited_path(queue, limit - len(jobs), params)
            want = limit - len(jobs)
            args = {**params, "limit": want, "ids": [x.job_id for x, _ in acks], "tokens": [x.token for x, _ in acks],
                    "results": [r for _, r in acks]}
            try:
                with self._live_connection(self._control) as conn:
                    conn.execute(Q["promote_queue"], {"queue": queue, "now": now, "limit": 1000})
                    rows = conn.execute(_ack_claim_sql(want), args).fetchall()
                    freed = [r for r in rows[0]["acked"] if r["concurrency_key"] is not None]
                    if freed:
                        with conn.transaction():
                            self._notify_freed(conn, freed)
            except psycopg.Error as exc:
                raise _translate(exc) from exc
            if acks:
                held_ids = {r["id"] for r in rows[0]["acked"]}
                held = [lease.job_id in held_ids for lease, _ in acks]
                acks = []
            if rows[0]["head_limited"]:
                self._limited_queues.add(queue)  # nothing was claimed: the limited path next
                continue
            jobs += _claimed_jobs([r for r in rows if r["id"] is not None])
            break
        return held, jobs

    def retry(self, lease: Lease, error: ErrorInfo, *, delay: float, now: float | None = None) -> JobState:
        with self._tx(control=True) as conn:
            row = conn.execute(
                Q["retry"],
                {"id": lease.job_id, "token": lease.token, "now": now, "delay": max(float(delay), 0.0),
                 "keep_errors": KEEP_ERRORS, "error": _error_json(error)},
            ).fetchone()
            if row is None:
                raise LeaseLost(lease.job_id, "retry refused")
            state = JobState(row["state"])
            if state is not JobState.DEAD or row["concurrency_key"] is not None:
                self._notify(conn, [row["queue"]])
        return state

    def kill(self, lease: Lease, error: ErrorInfo, *, now: float | None = None) -> None:
        with self._tx(control=True) as conn:
            row = conn.execute(
                Q["kill"],
                {"id": lease.job_id, "token": lease.token, "now": now, "keep_errors": KEEP_ERRORS,
                 "error": _error_json(error)},
            ).fetchone()
            if row is None:
                raise LeaseLost(lease.job_id, "kill refused")
            self._notify_freed(conn, [row])

    def release_claim(self, queue: str, claim_id: str, *, now: float | None = None) -> list[int]:
        check_claim_id(claim_id)
        with self._tx(control=True) as conn:
            rows = conn.execute(Q["release_claim"], {"queue": queue, "claim_id": claim_id}).fetchall()
            self._notify(conn, [r["queue"] for r in rows])
        return sorted(r["id"] for r in rows)

    def release(self, leases: Sequence[Lease], *, now: float | None = None) -> list[int]:
        if not leases:
            return []
        with self._tx(control=True) as conn:
            rows = conn.execute(
                Q["release"], {"ids": [x.job_id for x in leases], "tokens": [x.token for x in leases]}
            ).fetchall()
            self._notify(conn, [r["queue"] for r in rows])
        return sorted(r["id"] for r in rows)

    # -- maintenance ------------------------------------------------------------------
    def reap(self, *, limit: int = 1000, now: float | None = None) -> ReapResult:
        with self._tx(control=True) as conn:
            rows = conn.execute(Q["reap"], {"now": now, "limit": limit, "keep_errors": KEEP_ERRORS,
                                            "max_stalls": MAX_STALLS}).fetchall()
            if rows:
                conn.execute(Q["count_up"], {"name": "lease_expired", "queues": [r["queue"] for r in rows]})
                self._notify(conn, [r["queue"] for r in rows
                                    if r["state"] == "available" or r["concurrency_key"] is not None])
        return ReapResult(
            requeued=sorted(r["id"] for r in rows if r["state"] == "available"),
            dead=sorted(r["id"] for r in rows if r["state"] == "dead"),
        )

    def promote(self, *, limit: int = 1000, now: float | None = None) -> int:
        with self._tx(control=True) as conn:
            rows = conn.execute(Q["promote"], {"now": now, "limit": limit}).fetchall()
            self._notify(conn, [r["queue"] for r in rows])
        return len(rows)

    def prune(
        self, *, older_than: float, states: Sequence[JobState] = (JobState.SUCCEEDED,),
        limit: int = 1000, now: float | None = None,
    ) -> int:
        deleted = 0
        with self._tx(control=True) as conn:
            for state in states:
                if not JobState(state).is_final:
                    raise ValueError(f"prune only deletes finished jobs, not {state}")
                left = limit - deleted
                if left <= 0:
                    break
                deleted += conn.execute(
                    Q["prune"], {"state": str(state), "older_than": older_than, "limit": left, "now": now}
                ).rowcount
            conn.execute(Q["prune_fair_tags"], {"limit": limit})
            conn.execute(Q["prune_rate_claims"], {"now": now, "limit": limit})
        return deleted

    # -- inspection and administration ------------------------------------------------
    def get(self, job_id: int, *, connection: psycopg.Connection[Any] | None = None) -> Job | None:
        """With ``connection``, read through it (sees that transaction's uncommitted jobs)."""
        if connection is not None:
            try:
                with _bounded(connection), connection.cursor(row_factory=dict_row) as cur:
                    row = cur.execute(Q["get"], {"id": job_id}).fetchone()
            except psycopg.Error as exc:
                raise _translate(exc) from exc
            return _row_to_job(row) if row else None
        with self._tx() as conn:
            row = conn.execute(Q["get"], {"id": job_id}).fetchone()
        return _row_to_job(row) if row else None

    async def aget(self, job_id: int, *, connection: psycopg.AsyncConnection[Any]) -> Job | None:
        try:
            with _bounded(connection):
                async with connection.cursor(row_factory=dict_row) as cur:
                    await cur.execute(Q["get"], {"id": job_id})
                    row = await cur.fetchone()
        except psycopg.Error as exc:
            raise _translate(exc) from exc
        return _row_to_job(row) if row else None

    def list_jobs(
        self, *, state: JobState | None = None, queue: str | None = None, task: str | None = None,
        cursor: int | None = None, limit: int = 50,
    ) -> Page:
        check_filters(queue=queue, task=task)
        where: list[str] = []
        params: dict[str, Any] = {"limit": limit + 1}
        for column, value in (("state", str(state) if state is not None else None), ("queue", queue),
                              ("task", task)):
            if value is not None:
                where.append(f"{column} = %({column})s")
                params[column] = value
        if cursor is not None:
            where.append("id < %(cursor)s")
            params["cursor"] = cursor
        sql = Q["job_rows"]
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT %(limit)s"
        with self._tx() as conn:
            rows = conn.execute(sql.encode(), params).fetchall()
        jobs = [_row_to_job(r) for r in rows[:limit]]
        return Page(jobs=jobs, next_cursor=jobs[-1].id if len(rows) > limit and jobs else None)

    def stats(self, *, now: float | None = None, worker_ttl: float = 60.0, finished: bool = True) -> Stats:
        with self._tx() as conn:
            # REPEATABLE READ: every number from one snapshot.
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            p = {"now": now}
            row = conn.execute(Q["stats_now"], p).fetchone()
            assert row is not None
            t = float(row["now"])
            counts = conn.execute(Q["count_by_state" if finished else "count_unfinished"]).fetchall()
            due = conn.execute(Q["due_scheduled"], p).fetchall()
            oldest = conn.execute(Q["oldest_available"]).fetchall()
            counters = conn.execute(Q["counters"]).fetchall()
            expired = conn.execute(Q["expired_leases"], p).fetchall()
            workers = conn.execute(Q["workers"], {"now": now, "ttl": worker_ttl}).fetchall()
        queues = queue_stats_from_rows(t, counts, due, oldest, counters, expired)
        return Stats(
            now=t, queues=queues,
            workers=[
                WorkerInfo(id=w["id"], queues=list(w["queues"]), concurrency=w["concurrency"], host=w["host"],
                           pid=w["pid"], started_at=w["started_at"], last_seen=w["last_seen"],
                           running=w["running"], stuck=w["stuck"])
                for w in workers
            ],
        )

    def redrive(self, job_ids: Sequence[int] | None = None, *, queue: str | None = None,
                now: float | None = None) -> int:
        check_filters(queue=queue)
        with self._tx() as conn:
            back: list[dict[str, Any]] = []
            if job_ids is None:
                back += conn.execute(Q["redrive_all"], {"now": now, "queue": queue}).fetchall()
                keyed = conn.execute(Q["dead_with_unique_key"], {"queue": queue}).fetchall()
                ids = [r["id"] for r in keyed]
            else:
                ids = list(job_ids)
            for i in ids:
                row = conn.execute(Q["redrive"], {"now": now, "id": i}).fetchone()
                if row:
                    back.append(row)
            if back:
                # Back in the queue as new jobs: fresh fair tags, in id order.
                back.sort(key=lambda r: r["id"])
                with conn.cursor() as cur:
                    _run(cur, _retag_plan(back))
            self._notify(conn, [r["queue"] for r in back])
        return len(back)

    def purge(self, *, state: JobState = JobState.DEAD, queue: str | None = None,
              job_ids: Sequence[int] | None = None) -> int:
        state = JobState(state)
        if not state.is_final:
            raise ValueError(f"purge only deletes finished jobs, not {state}")
        check_filters(queue=queue)
        with self._tx() as conn:
            return conn.execute(
                Q["purge"], {"state": str(state), "queue": queue,
                             "ids": list(job_ids) if job_ids is not None else None}
            ).rowcount

    def cancel(self, job_id: int, *, now: float | None = None) -> bool:
        with self._tx() as conn:
            row = conn.execute(Q["cancel"], {"id": job_id, "now": now}).fetchone()
            if row is not None and row["was"] == "running":
                self._notify_freed(conn, [row])
        return row is not None

    def wait_for_jobs(self, queues: Sequence[str], timeout: float, *, verify: bool = True) -> bool:
        start = time.monotonic()
        deadline = start + timeout
        # The client's bound on the LISTEN connection for the whole call: the wait plus one
        # call's budget (a stalled server never wakes us, nor answers the readiness query).
        until = deadline + _call_budget()
        generation = self._wake_generation
        wanted = set(queues)
        with self._listen_lock:
            try:
                conn = self._listen_connection(until)
                with _Guard(conn, until, close=True):
                    # Listening only while waiting: the server keeps each notification until
                    # every listening session has read it, and a busy worker reads nothing, so
                    # one that stayed listening would hold them all (the queue has a fixed
                    # size, and when it is full every notifying transaction fails). LISTEN
                    # comes before the first look, so a job enqueued in between is seen by one
                    # or the other.
                    conn.execute(f"LISTEN {CHANNEL}")
                    try:
                        return self._wait_listening(conn, queues, wanted, deadline, generation, verify)
                    finally:
                        self._unlisten(conn)
            except StoreUnavailable:
                self._drop_listener()
                raise
            except psycopg.Error as exc:
                self._drop_listener()
                raise _translate(exc) from exc

    def _unlisten(self, conn: psycopg.Connection[dict[str, Any]]) -> None:
        if conn.closed or conn.broken:
            self._drop_listener()
            return
        try:
            conn.execute(f"UNLISTEN {CHANNEL}")
            # What came before the UNLISTEN: read it now, or it would wait in the connection's
            # backlog for the next wait.
            for _ in conn.notifies(timeout=0):
                pass
        except psycopg.Error:
            self._drop_listener()  # a closed session listens to nothing either

    def _wait_listening(self, conn: psycopg.Connection[dict[str, Any]], queues: Sequence[str],
                        wanted: set[str], deadline: float, generation: int, verify: bool) -> bool:
        look = True
        while self._wake_generation == generation:
            if look:
                row = conn.execute(Q["ready"], {"queues": list(queues)}).fetchone()
                assert row is not None
                if row["ready"]:
                    return True
                if row["next_due_in"] is not None:
                    deadline = min(deadline, time.monotonic() + max(0.0, row["next_due_in"]))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            # Short slices so wake() (shutdown) is noticed without a round trip. A notification
            # only means "look again": it can be stale (its job claimed already, or seen by the
            # last look), and reporting work that is not there would make the worker read its
            # empty claim as limits holding jobs back, and back off. Everything that has come
            # in is read at once, so a burst of enqueues costs one look, not one each.
            notes = [*conn.notifies(timeout=min(remaining, 0.1), stop_after=1),
                     *conn.notifies(timeout=0, stop_after=DRAIN_AT_ONCE)]
            look = any(note.payload in wanted for note in notes)
            if look and not verify:
                return True
        return True

    def _listen_connection(self, until: float) -> psycopg.Connection[dict[str, Any]]:
        if self._listener is None or self._listener.closed:
            conn = psycopg.connect(self._conninfo, autocommit=True, row_factory=dict_row)  # connect_timeout
            self._listener = conn
            with _Guard(conn, until, close=True):
                _configure(conn)
        return self._listener

    def _drop_listener(self) -> None:
        if self._listener is not None:
            try:
                self._listener.close()
            except psycopg.Error:
                pass
            finally:
                self._listener = None

    def wake(self) -> None:
        self._wake_generation += 1

    def try_lock(self, name: str, *, ttl: float) -> StoreLock | None:
        """A session advisory lock (``pg_try_advisory_lock``, keyed by the name and the schema)
        on a connection of its own, held until released: the server drops it when that
        connection ends, so a holder that dies frees it at once and ``ttl`` is not needed."""
        key = f"conveyor_lock:{check_lock_name(name)}:"
        try:
            conn = psycopg.connect(self._conninfo, autocommit=True, row_factory=dict_row)  # connect_timeout
        except psycopg.Error as exc:
            raise _translate(exc) from exc
        try:
            with _Guard(conn, time.monotonic() + _call_budget(), close=True):
                _configure(conn)
                row = conn.execute(TRY_LOCK, [key]).fetchone()
        except psycopg.Error as exc:
            conn.close()
            raise _translate(exc) from exc
        if row is None or not row["held"]:
            conn.close()
            return None
        held = _SessionLock(conn, self)
        with self._locks_mutex:
            self._locks.add(held)
        return held

    # -- workers ----------------------------------------------------------------------
    def record_worker(self, info: WorkerInfo, *, now: float | None = None) -> None:
        with self._tx(control=True) as conn:
            conn.execute(
                Q["record_worker"],
                {"id": info.id, "queues": json.dumps(info.queues), "concurrency": info.concurrency,
                 "host": info.host, "pid": info.pid, "started_at": info.started_at, "now": now,
                 "running": info.running, "stuck": info.stuck},
            )
            conn.execute(Q["forget_workers"], {"now": now})

    def remove_worker(self, worker_id: str) -> None:
        with self._tx(control=True) as conn:
            conn.execute(Q["remove_worker"], {"id": worker_id})

    # -- transactional completion -----------------------------------------------------
    @contextmanager
    def completion_connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection with an open transaction, for a task's writes plus its ack."""
        try:
            # The task holds it as long as it runs: only our own uses of it are bounded (the
            # probe here, ack/record_step/enqueue/get on it, and the rollback below).
            with self._live_connection(hold=False) as conn:
                conn.autocommit = False
                try:
                    yield conn
                finally:
                    if not conn.closed:
                        with _bounded(conn, close=True):
                            conn.rollback()  # no-op after a commit
                            conn.autocommit = True
        except psycopg.Error as exc:
            raise _translate(exc) from exc


def _pool_sizes(url: str) -> tuple[str, dict[str, int]]:
    """The URL without the pool's own query parameters (POOL_PARAMS), and their values."""
    parts = urlsplit(url)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    if not any(k in POOL_PARAMS for k, _ in pairs):
        return url, {}
    sizes: dict[str, int] = {}
    for key, value in pairs:
        if key in POOL_PARAMS:
            try:
                sizes[key] = int(value)
            except ValueError:
                raise ConfigurationError(f"PostgreSQL URL: {key} must be a whole number, got {value!r}") from None
    rest = urlencode([(k, v) for k, v in pairs if k not in POOL_PARAMS])
    return urlunsplit(parts._replace(query=rest)), sizes


def _join_transaction(conn: psycopg.Connection[Any]) -> None:
    """Open the caller's transaction if none is open yet, so the caller's commit or rollback
    decides. (``conn.transaction()`` on an idle connection would commit on its own.)"""
    if not conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        conn.execute("BEGIN")


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _row_to_job(row: dict[str, Any]) -> Job:
    return make_job(
        id=row["id"], task=row["task"], queue=row["queue"], args=row["args"], state=JobState(row["state"]),
        attempts=row["attempt"], max_attempts=row["max_attempts"], priority=row["priority"],
        run_at=row["run_at"].timestamp(), timeout=float(row["timeout_s"]),
        created_at=row["created_at"].timestamp(), uid=row["uid"], attempted_at=_ts(row["attempted_at"]),
        finished_at=_ts(row["finished_at"]), result=row["result"], errors=row["errors"],
        unique_key=row["unique_key"], worker_id=row["worker_id"], lease_token=row["lease_token"],
        lease_expires_at=_ts(row["lease_expires_at"]), meta=row["meta"], fair_key=row["fair_key"],
        steps=row["steps"], concurrency_key=row["concurrency_key"], concurrency_limit=row["concurrency_limit"],
        rate_key=row["rate_key"], rate_limit=row["rate_limit"], rate_period=row["rate_period"],
        stalls=row["stalls"],
    )


@functools.lru_cache(maxsize=256)
def _claim_sql(limit: int) -> bytes:
    """The claim statement with its LIMIT written in. As a parameter, the planner would guess
    LIMIT at 10% of the table, so the generic plan (a hash join over a scan of every job) never
    wins and each call is planned anew. As a constant, once psycopg has prepared the statement
    (one per distinct limit: a worker asks for 1 to its number of slots), PostgreSQL switches
    to the generic plan, the same index scan and nested loop, and stops planning it."""
    return Q["claim"].replace("%(limit)s", str(int(limit))).encode()


@functools.lru_cache(maxsize=256)
def _ack_claim_sql(limit: int) -> bytes:
    """The claim statement (as _claim_sql) with ack_many in front as a CTE, and the acked jobs
    as a column of every row (the claim always returns at least one row). Acked jobs are
    running, never candidates of the claim."""
    claim = _claim_sql(limit).decode()
    head, select = "WITH picked AS MATERIALIZED (", "\nSELECT claimed.*,"
    if claim.count(head) != 1 or claim.count(select) != 1:
        raise AssertionError("the claim statement changed shape: update _ack_claim_sql")
    claim = claim.replace(head, f"WITH acked AS ({Q['ack_many']}), {head[5:]}")
    claim = claim.replace(select, "\nSELECT (SELECT coalesce(json_agg(json_build_object('id', a.id, "
                                  "'concurrency_key', a.concurrency_key, 'queue', a.queue)), '[]') "
                                  "FROM acked AS a) AS acked, claimed.*,")
    return claim.encode()


def _claimed_jobs(rows: list[dict[str, Any]]) -> list[Job]:
    rows.sort(key=lambda r: (r["priority"], r["fair_tag"], r["run_at"], r["id"]))  # claim order
    return [_row_to_job(r) for r in rows]


def _plain(job: NewJob) -> bool:
    """A job whose enqueue is the insert alone: no unique key to look up, no queue depth to
    check under a lock, no fair tag to reserve."""
    return job.unique_key is None and job.max_depth is None and job.fair_key is None


def _plain_values(job: NewJob) -> tuple[Any, ...]:
    """What a plain job shares with its run in insert_plain's JSON document, in that order."""
    return (job.queue, job.task, job.priority, job.run_at, max(job.delay, 0.0), job.max_attempts, job.timeout,
            job.meta, job.concurrency_key, job.concurrency_limit, job.rate_key, job.rate_limit, job.rate_period)


def _plain_runs(jobs: Sequence[NewJob]) -> list[list[Any]]:
    """insert_plain's document: consecutive jobs with the same _plain_values as one run,
    ``[*values, [args, ...]]``, in batch order."""
    runs: list[list[Any]] = []
    last: tuple[Any, ...] | None = None
    for job in jobs:
        values = _plain_values(job)
        if values != last:
            runs.append([*values, []])
            last = values
        runs[-1][-1].append(job.args)
    return runs


def _insert_params(job: NewJob, now: float | None, fair_tag: int | None) -> dict[str, Any]:
    return {
        "queue": job.queue, "task": job.task, "args": job.args, "priority": job.priority,
        "run_at": job.run_at, "delay": max(job.delay, 0.0), "max_attempts": job.max_attempts,
        "timeout_s": job.timeout, "unique_key": job.unique_key, "meta": job.meta, "now": now,
        "fair_key": job.fair_key, "fair_tag": fair_tag, "unique_for": job.unique_for,
        "concurrency_key": job.concurrency_key, "concurrency_limit": job.concurrency_limit,
        "rate_key": job.rate_key, "rate_limit": job.rate_limit, "rate_period": job.rate_period,
    }


# -- the limited claim --------------------------------------------------------------------------

CLAIM_PAGE = 200  # jobs per page of the limited walk after the first


class _Limits:
    """What one limited claim knows of each limit key: whether it holds the key's lock, running
    jobs per concurrency key and claims per (rate key, period) window, each plus the jobs this
    claim admitted so far."""

    def __init__(self, conn: psycopg.Connection[dict[str, Any]], now: float | None) -> None:
        self._conn = conn
        self._now = now
        self.locked: set[tuple[str, str]] = set()  # ("c" | "r", key)
        self.busy: set[tuple[str, str]] = set()  # another claimer holds the lock: pass over
        self.running: dict[str, int] = {}
        self.recent: dict[tuple[str, float], int] = {}
        self.counted_at: dict[tuple[str, float], datetime] = {}  # the store's time of each window's count

    @staticmethod
    def keys_of(row: dict[str, Any]) -> list[tuple[str, str]]:
        keys = []
        if row["concurrency_key"] is not None:
            keys.append(("c", row["concurrency_key"]))
        if row["rate_key"] is not None:
            keys.append(("r", row["rate_key"]))
        return keys

    def known(self, row: dict[str, Any]) -> bool:
        """Whether every limit of ``row`` is decided (locked and counted, or busy)."""
        for kind, key in self.keys_of(row):
            if (kind, key) in self.busy:
                continue
            if (kind, key) not in self.locked:
                return False
            if kind == "c" and key not in self.running:
                return False
            if kind == "r" and (key, row["rate_period"]) not in self.recent:
                return False
        return True

    def blocked(self, row: dict[str, Any]) -> bool:
        """Whether what is known already holds ``row`` back (undecided limits do not)."""
        ckey, rkey = row["concurrency_key"], row["rate_key"]
        if ckey is not None and (("c", ckey) in self.busy or self.running.get(ckey, 0) >= row["concurrency_limit"]):
            return True
        return rkey is not None and (
            ("r", rkey) in self.busy or self.recent.get((rkey, row["rate_period"]), 0) >= row["rate_limit"])

    def decide(self, rows: Sequence[dict[str, Any]], chosen: Sequence[dict[str, Any]]) -> None:
        """Lock and count the undecided limits of ``rows``: two statements, in that order."""
        to_lock = sorted({k for r in rows for k in self.keys_of(r)} - self.locked - self.busy)
        if to_lock:
            got = self._conn.execute(Q["limit_locks"], {
                "kinds": [kind for kind, _ in to_lock], "keys": [key for _, key in to_lock]}).fetchall()
            for r in got:
                (self.locked if r["locked"] else self.busy).add((r["kind"], r["key"]))
        ckeys = sorted({r["concurrency_key"] for r in rows if r["concurrency_key"] is not None
                        and ("c", r["concurrency_key"]) in self.locked and r["concurrency_key"] not in self.running})
        windows = sorted({(r["rate_key"], float(r["rate_period"])) for r in rows if r["rate_key"] is not None
                          and ("r", r["rate_key"]) in self.locked
                          and (r["rate_key"], r["rate_period"]) not in self.recent})
        if not ckeys and not windows:
            return
        counts = self._conn.execute(Q["limit_counts"], {
            "ckeys": ckeys, "rkeys": [k for k, _ in windows], "periods": [p for _, p in windows],
            "now": self._now}).fetchall()
        for r in counts:
            if r["kind"] == "c":
                # Jobs admitted by this claim are not running yet: none has this key (it was
                # undecided until now), so the count stands as read.
                self.running[r["key"]] = r["n"]
            else:
                window = (r["key"], r["period"])
                self.recent[window] = r["n"] + sum(1 for c in chosen if c["rate_key"] == r["key"])
                self.counted_at[window] = r["at"]

    def admit(self, row: dict[str, Any]) -> bool:
        if self.blocked(row):
            return False
        if row["rate_key"] is not None:
            for window in self.recent:
                if window[0] == row["rate_key"]:
                    self.recent[window] += 1
        if row["concurrency_key"] is not None:
            self.running[row["concurrency_key"]] += 1
        return True


def _claim_limited(conn: psycopg.Connection[dict[str, Any]],
                   params: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """Claim in queue order, passing over jobs whose concurrency or rate limit is reached, or
    whose key another claimer is deciding right now; at most CLAIM_SCAN jobs looked at. Returns
    the claimed rows and whether any job looked at had a limit."""
    limit: int = params["limit"]
    limits = _Limits(conn, params["now"])
    chosen: list[dict[str, Any]] = []
    saw_limited = False
    seen = 0
    page = min(max(limit * 4, 50), CLAIM_SCAN)
    last: dict[str, Any] | None = None
    while len(chosen) < limit and seen < CLAIM_SCAN:
        want = min(page, CLAIM_SCAN - seen)
        if last is None:
            batch = conn.execute(Q["claim_candidates"], {"queue": params["queue"], "limit": want}).fetchall()
        else:
            batch = conn.execute(Q["claim_candidates_after"], {
                "queue": params["queue"], "limit": want, "priority": last["priority"],
                "fair_tag": last["fair_tag"], "run_at": last["run_at"], "id": last["id"]}).fetchall()
        seen += len(batch)
        for i, row in enumerate(batch):
            if len(chosen) >= limit:
                break
            if row["concurrency_key"] is None and row["rate_key"] is None:
                chosen.append(row)
                continue
            saw_limited = True
            if not limits.known(row):
                # Decide this job's keys and those of the jobs after it that could still be
                # admitted, as many as the slots left: one lock and one count statement for
                # all of them, without locking keys this claim will not get to.
                ahead: list[dict[str, Any]] = []
                for nxt in batch[i:]:
                    if len(ahead) >= limit - len(chosen):
                        break
                    if not limits.blocked(nxt):
                        ahead.append(nxt)
                limits.decide([r for r in ahead if not limits.known(r)], chosen)
            if limits.admit(row):
                chosen.append(row)
        if len(batch) < want:
            break
        last = batch[-1]
        page = CLAIM_PAGE
    if not chosen:
        return [], saw_limited
    rate_ats = [limits.counted_at[(r["rate_key"], r["rate_period"])] if r["rate_key"] is not None else None
                for r in chosen]
    held_ids = [r["id"] for r in chosen[params["start"]:]]  # claim order: the first `start` start
    rows = conn.execute(Q["claim_ids"], {**params, "ids": [r["id"] for r in chosen], "rate_ats": rate_ats,
                                         "held_ids": held_ids}).fetchall()
    return rows, saw_limited


# -- one enqueue, run by the sync and the async driver ---------------------------------------
# The enqueue is written once, as a generator of statements (a plan): it yields each statement
# and receives its rows. ``_run`` executes a plan on a sync cursor, ``_arun`` on an async one.

T = TypeVar("T")


@dataclass(frozen=True)
class _Stmt:
    """One statement of a plan. ``fetch``: "none", "one" (a row or None), "all" (the rows) or
    "many" (executemany of ``params``, a list: one RETURNING row or None per parameter set)."""

    fetch: str
    sql: str
    params: Any


Plan = Generator[_Stmt, Any, T]


def _run(cur: psycopg.Cursor[dict[str, Any]], plan: Plan[T]) -> T:
    reply: Any = None
    try:
        while True:
            stmt = plan.send(reply)
            if stmt.fetch == "many":
                cur.executemany(stmt.sql, stmt.params, returning=True)
                rows: list[dict[str, Any] | None] = []
                while True:
                    rows.append(cur.fetchone())
                    if not cur.nextset():
                        break
                reply = rows
                continue
            cur.execute(stmt.sql, stmt.params)
            reply = cur.fetchone() if stmt.fetch == "one" else cur.fetchall() if stmt.fetch == "all" else None
    except StopIteration as done:
        return cast(T, done.value)


async def _arun(cur: psycopg.AsyncCursor[dict[str, Any]], plan: Plan[T]) -> T:
    reply: Any = None
    try:
        while True:
            stmt = plan.send(reply)
            if stmt.fetch == "many":
                await cur.executemany(stmt.sql, stmt.params, returning=True)
                rows: list[dict[str, Any] | None] = []
                while True:
                    rows.append(await cur.fetchone())
                    if not cur.nextset():
                        break
                reply = rows
                continue
            await cur.execute(stmt.sql, stmt.params)
            if stmt.fetch == "one":
                reply = await cur.fetchone()
            elif stmt.fetch == "all":
                reply = await cur.fetchall()
            else:
                reply = None
    except StopIteration as done:
        return cast(T, done.value)


def _enqueue_plan(jobs: Sequence[NewJob], now: float | None) -> Plan[list[EnqueueResult]]:
    """Write a batch in the open transaction; raising (QueueFull) lets the caller roll it back."""
    limits = depth_limits(jobs)
    for queue in sorted(limits):
        # Serialise enqueuers of a limited queue (sorted: no deadlock between batches), so
        # two of them cannot both see room for the last slot.
        yield _Stmt("none", DEPTH_LOCK, [queue])
    if len(jobs) > 1 and all(_plain(job) for job in jobs):
        return (yield from _plain_batch_plan(jobs, now))
    tags = yield from _fair_tags_plan(jobs, now)
    params = [_insert_params(job, now, tag) for job, tag in zip(jobs, tags, strict=True)]
    rows: list[dict[str, Any] | None] = yield _Stmt("many", Q["insert"], params)
    results: list[EnqueueResult] = []
    for job, param, row in zip(jobs, params, rows, strict=True):
        for _ in range(UNIQUE_RACE_TRIES):
            if row is not None:
                results.append(EnqueueResult(row["id"], True, row["at"], row["uid"]))
                break
            found = yield _Stmt("one", Q["find_unique"], {"unique_key": job.unique_key, "now": now})
            if found is not None:
                results.append(EnqueueResult(found["id"], False, found["at"]))
                break
            # The holder finished (or its window closed) between the insert and this read.
            row = yield _Stmt("one", Q["insert"], param)
        else:
            raise StoreError(f"unique key {job.unique_key!r} keeps changing hands during enqueue; retry")
    for queue, limit in sorted(limits.items()):
        depth = yield _Stmt("one", Q["depth"], {"queue": queue})
        refuse_overflow(queue, limit, depth["n"], jobs, results)
    queues = sorted({j.queue for j, r in zip(jobs, results, strict=True) if r.created})
    if queues:
        # Delivered at commit, so a woken worker always finds the job.
        yield _Stmt("none", Q["notify"], {"channel": CHANNEL, "queues": queues})
    return results


def _plain_batch_plan(jobs: Sequence[NewJob], now: float | None) -> Plan[list[EnqueueResult]]:
    """A batch of plain jobs (see _plain) in one statement, instead of one insert per job."""
    doc = json.dumps(_plain_runs(jobs), allow_nan=False)
    row = yield _Stmt("one", Q["insert_plain"], {"jobs": doc, "now": now})
    yield _Stmt("none", Q["notify"], {"channel": CHANNEL, "queues": sorted({j.queue for j in jobs})})
    at = row["at"]
    return [EnqueueResult(i, True, at, uid) for i, uid in zip(row["ids"], row["uids"], strict=True)]


def _fair_tags_plan(jobs: Sequence[NewJob], now: float | None) -> Plan[list[int | None]]:
    """The fair tag of each job with a fair key that will be new. None for the others: the
    insert gives a job without a fair key its round's ``vtime + 1``. A job whose unique key is
    held returns the holder and takes no tag (should the key change hands meanwhile, the
    insert still gives it one: its round's ``vtime + 1``)."""
    tags: list[int | None] = [None] * len(jobs)
    if all(job.fair_key is None for job in jobs):
        return tags
    keys = sorted({j.unique_key for j in jobs if j.fair_key is not None and j.unique_key is not None})
    taken: set[str] = set()
    if keys:
        held = yield _Stmt("all", Q["unique_held"], {"keys": keys, "now": now})
        taken = {r["unique_key"] for r in held}
    new: list[tuple[int, tuple[str, int, str]]] = []
    for i, job in enumerate(jobs):
        if job.unique_key is not None:
            if job.unique_key in taken:  # held, or taken by an earlier job of this batch
                continue
            taken.add(job.unique_key)
        if job.fair_key is not None:
            new.append((i, (job.queue, job.priority, job.fair_key)))
    reserved = yield from _take_tags_plan([slot for _, slot in new])
    for (i, _), tag in zip(new, reserved, strict=True):
        tags[i] = tag
    return tags


def _take_tags_plan(slots: Sequence[tuple[str, int, str]]) -> Plan[list[int]]:
    """Tags for new jobs at these (queue, priority, fair key) slots, in order: each slot's jobs
    take consecutive tags from ``max(last_tag, vtime) + 1`` (backends/base.py)."""
    counts = Counter(slots)
    if not counts:
        return []
    order = sorted(counts)
    rows = yield _Stmt("all", Q["take_fair_tags"], {
        "queues": [q for q, _, _ in order], "priorities": [p for _, p, _ in order],
        "keys": [k for _, _, k in order], "counts": [counts[x] for x in order]})
    next_tag: dict[tuple[str, int, str], int] = {}
    for r in rows:
        slot = (r["queue"], r["priority"], r["fair_key"])
        next_tag[slot] = r["last_tag"] - counts[slot] + 1
    tags: list[int] = []
    for slot in slots:
        tags.append(next_tag[slot])
        next_tag[slot] += 1
    return tags


def _retag_plan(rows: Sequence[dict[str, Any]]) -> Plan[None]:
    """Fresh fair tags for redriven jobs (rows of id, queue, priority, fair_key), in order."""
    fair = [r for r in rows if r["fair_key"] is not None]
    tags = yield from _take_tags_plan([(r["queue"], r["priority"], r["fair_key"]) for r in fair])
    tag_of = {r["id"]: tag for r, tag in zip(fair, tags, strict=True)}
    yield _Stmt("none", Q["retag"], {"ids": [r["id"] for r in rows], "tags": [tag_of.get(r["id"]) for r in rows]})


# -- exactly-once steps -----------------------------------------------------------------------

def _check_step_name(step: str) -> None:
    if not isinstance(step, str) or not NAME_RE.fullmatch(step):
        raise InvalidName(f"step name must match {NAME_RE.pattern}, got {step!r}")


def _record_step(cur: psycopg.Cursor[dict[str, Any]], job_id: int, step: str,
                 result: str | None, uid: str | None) -> tuple[bool, str | None]:
    params = {"id": job_id, "step": step, "result": result, "uid": uid}
    try:
        if cur.execute(Q["record_step"], params).fetchone() is not None:
            return True, result
    except pgerrors.ForeignKeyViolation:
        raise JobNotFound(f"no job with id {job_id}") from None  # deleted while we recorded
    row = cur.execute(Q["read_step"], params).fetchone()
    assert row is not None
    if not row["job_found"]:
        # No such job, or the id names another job now (the store lost data and its sequence
        # handed the id out again): either way not this job.
        raise JobNotFound(f"no job with id {job_id} and uid {uid}")
    if not row["found"]:
        raise StoreError(f"step {step!r} of job {job_id}: record neither written nor found; retry")
    value = row["result"]  # the stored JSON text; SQL NULL is a step that returned None
    return False, None if value in (None, "null") else value


def _error_json(error: ErrorInfo) -> str:
    return json.dumps({"kind": error.kind, "type": error.type, "message": error.message,
                       "traceback": error.traceback}, ensure_ascii=False)


def _translate(exc: psycopg.Error) -> StoreError:
    if isinstance(exc, pgerrors.DiskFull):
        return StorageFull(f"PostgreSQL: out of disk space; nothing was written: {exc}")
    return StoreError(f"PostgreSQL: {type(exc).__name__}: {str(exc).strip()}")


class _SessionLock(StoreLock):
    """A session advisory lock and the connection that holds it: closing it lets go."""

    def __init__(self, conn: psycopg.Connection[dict[str, Any]], owner: PostgresBackend) -> None:
        self._conn: psycopg.Connection[dict[str, Any]] | None = conn
        self._owner = owner
        self._mutex = threading.Lock()

    def renew(self) -> bool:
        """Held while its session lives: one round trip says so."""
        with self._mutex:
            conn = self._conn
            if conn is None:
                return False
            try:
                with _bounded(conn, close=True):
                    conn.execute("SELECT 1")
                return True
            except (psycopg.Error, StoreError):
                self._conn = None
        self.release()
        with suppress(psycopg.Error):
            conn.close()
        return False

    def release(self) -> None:
        with self._mutex:
            conn, self._conn = self._conn, None
        if conn is not None:
            with suppress(psycopg.Error):
                conn.close()  # the session ends, and its advisory lock with it
        with self._owner._locks_mutex:
            self._owner._locks.discard(self)
