"""How the PostgreSQL backend gets its connections, and the client's own deadline on each.

Every network call has a bound: connecting (``connect_timeout``), each statement
(``statement_timeout``, enforced by the server), a dead peer (``tcp_user_timeout``), and a
deadline kept by the client itself (:class:`Guard`), which also fires when the server, or the
path to it, stops answering altogether. Connections come from two pools (:class:`PooledBackend`):
the main one for producers, tasks and the app's own calls, and a control pool for the
worker's own transitions (claim, heartbeat, ack...), so tasks holding connections can never
starve a heartbeat.

The timeouts here are read when a call runs, from this module: tests that shorten them patch
them here.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import errors as pgerrors
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from ...errors import ConfigurationError, StorageFull, StoreError, StoreUnavailable
from .. import forking, redact_url
from ..base import Backend

log = logging.getLogger("conveyor.postgres")

Conn = psycopg.Connection[dict[str, Any]]
Pool = ConnectionPool[Conn]

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
# Give up reconnecting quickly: the next request then connects at once, instead of waiting out
# the pool's exponential backoff long after the server is back.
RECONNECT_TIMEOUT = 5.0
# The client's own deadline on a connection: statement_timeout plus this. statement_timeout is
# enforced by the server, so it never fires when the server, or the path to it, stops answering
# (keepalives and tcp_user_timeout see a healthy peer behind a proxy or a stuck server). The
# margin lets the server's own timeout, which keeps the connection, win when the server is there.
DEADLINE_MARGIN_S = 0.5


def statement_budget() -> float:
    """How long one call may use a connection: statement_timeout + the margin."""
    return STATEMENT_TIMEOUT_MS / 1000 + DEADLINE_MARGIN_S


def call_budget() -> float:
    """How long one call may take in all: waiting for a connection, then using it."""
    return max(POOL_TIMEOUT, STATEMENT_TIMEOUT_MS / 1000) + DEADLINE_MARGIN_S


# -- the deadlines --------------------------------------------------------------------------------

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
                self._thread = threading.Thread(target=self._run, name="conveyor-pg-deadlines",
                                                daemon=True)
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


class Guard:
    """``with Guard(conn, at):`` the connection is shut down if the block is still running at
    ``at`` (time.monotonic()); the block's driver error then becomes :class:`StoreUnavailable`
    (unless ``translate`` is false). With ``close``, a connection whose deadline fired is closed
    on the way out (so a pool drops it). A block that finished anyway keeps its result."""

    __slots__ = ("_budget", "_close", "_conn", "_entry", "_translate")

    def __init__(self, conn: Any, at: float, *, close: bool = False,
                 translate: bool = True) -> None:
        self._conn = conn
        self._close = close
        self._translate = translate
        self._budget = at - time.monotonic()
        self._entry = _WATCHDOG.arm(conn, at)

    @property
    def fired(self) -> bool:
        return self._entry.fired

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if not _WATCHDOG.disarm(self._entry):
            return
        if self._close and isinstance(self._conn, psycopg.Connection):
            with suppress(psycopg.Error):
                self._conn.close()
        if self._translate and isinstance(exc, psycopg.Error):
            raise StoreUnavailable(
                f"PostgreSQL did not answer within {max(self._budget, 0.0):.1f}s (server or "
                "network stalled); the connection was dropped and the call abandoned: it may or "
                "may not have taken effect") from exc


def bounded(conn: Any, *, close: bool = False) -> Guard:
    """A guard for one call on a connection: statement_timeout + the margin from now."""
    return Guard(conn, time.monotonic() + statement_budget(), close=close)


def translate(exc: psycopg.Error) -> StoreError:
    """The driver's error as the store error the app sees."""
    if isinstance(exc, pgerrors.DiskFull):
        return StorageFull(f"PostgreSQL: out of disk space; nothing was written: {exc}")
    return StoreError(f"PostgreSQL: {type(exc).__name__}: {str(exc).strip()}")


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


def configure(conn: psycopg.Connection[Any]) -> None:
    """The session settings of every connection (a pool's worker runs this on each new one)."""
    # Bounded too, or a stall right after connecting would hold that worker for ever.
    with Guard(conn, time.monotonic() + statement_budget(), close=True, translate=False):
        conn.execute(f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}")
        conn.execute("SET idle_in_transaction_session_timeout = 60000")


# -- the pools ------------------------------------------------------------------------------------

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


def _new_pool(conninfo: str, name: str, min_size: int, max_size: int) -> Pool:
    """A pool of autocommit connections with dict rows, not opened yet."""
    return ConnectionPool(
        conninfo=conninfo, kwargs={"autocommit": True, "row_factory": dict_row},
        min_size=min_size, max_size=max_size, open=False, timeout=POOL_TIMEOUT,
        reconnect_timeout=RECONNECT_TIMEOUT, configure=configure, name=name, max_idle=MAX_IDLE,
    )


def _fresh_pool(old: ConnectionPool[Any], max_size: int) -> ConnectionPool[Any]:
    """A pool like ``old``, not opened yet, for a forked child."""
    return ConnectionPool(
        conninfo=old.conninfo, kwargs=old.kwargs, min_size=old.min_size,
        max_size=max(max_size, old.min_size), open=False, timeout=old.timeout,
        reconnect_timeout=old.reconnect_timeout, configure=configure, name=old.name,
        max_idle=old.max_idle,
    )


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
                raise ConfigurationError(
                    f"PostgreSQL URL: {key} must be a whole number, got {value!r}") from None
    rest = urlencode([(k, v) for k, v in pairs if k not in POOL_PARAMS])
    return urlunsplit(parts._replace(query=rest)), sizes


class PooledBackend(Backend):
    """The backend's two pools: sized, checked before each use, bounded, and made afresh in a
    forked child. PostgresBackend builds on this."""

    _pools_pending = False  # a forked child's pools are opened on first use

    def __init__(self, url: str, *, min_size: int | None = None,
                 max_size: int | None = None) -> None:
        """``max_size`` (or ``?pool_max_size=`` in the URL) fixes the main pool's size; unset, it
        is POOL_ROOM plus the task slots of the workers running in this process
        (reserve_connections)."""
        self.url = url
        url, sizes = _pool_sizes(url)
        min_size = min_size if min_size is not None else sizes.get("pool_min_size", 1)
        self._fixed_size = max_size if max_size is not None else sizes.get("pool_max_size")
        if min_size < 0 or (self._fixed_size is not None
                            and self._fixed_size < max(min_size, 1)):
            raise ConfigurationError(
                "PostgreSQL pool sizes: need 0 <= pool_min_size <= pool_max_size, "
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
            raise StoreError(f"PostgreSQL: cannot connect to {redact_url(url)}: "
                             f"{str(exc).strip()}") from None
        self._pool: Pool = _new_pool(self._conninfo, "conveyor", min_size,
                                     max(self._fixed_size or POOL_ROOM, min_size))
        self._control: Pool = _new_pool(self._conninfo, "conveyor-control", 1, CONTROL_SIZE)
        try:
            self._pool.open(wait=True, timeout=POOL_TIMEOUT)
            self._control.open(wait=True, timeout=POOL_TIMEOUT)
        except PoolTimeout as exc:
            self._pool.close()
            self._control.close()
            raise StoreError(f"PostgreSQL: cannot connect: {exc}") from None
        # Pool name -> until when a dead connection it took back may still be being replaced.
        self._replacing: dict[str, float] = {}

    def _after_fork_in_child(self) -> None:
        # The parent's pools are its sessions: closing them here would send Terminate on them,
        # and their pool threads are not in this process. They are kept untouched (psycopg
        # finishes a connection only in the process that opened it) and this process opens
        # its own on first use.
        forking.keep_inherited(self._pool, self._control)
        # The parent's workers are not in this process: the pools are sized for none yet.
        self._reserved = self._workers = 0
        self._size_lock = threading.Lock()
        self._pool = _fresh_pool(self._pool, self._fixed_size or POOL_ROOM)
        self._control = _fresh_pool(self._control, CONTROL_SIZE)
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

    def _close_pools(self) -> None:
        self._pool.close()
        self._control.close()

    @contextmanager
    def _live_connection(self, pool: Pool | None = None, *, until: float | None = None,
                         hold: bool = True) -> Iterator[Conn]:
        """A pooled connection that just answered. Dead ones (killed backend, server restart)
        go back to the pool, which discards them, and we take the next: probing here instead
        of the pool's own check avoids its growing sleeps between failed checks.

        Bounded by the client's own clock: waiting for a connection by ``POOL_TIMEOUT``, and the
        whole call by ``until`` (default: now + ``call_budget()``), using the connection by
        ``statement_budget()`` at most. Past that, the connection is shut down and discarded
        and the call raises StoreUnavailable. With ``hold`` false only the probe is bounded
        (the caller bounds its own uses of the connection)."""
        if self._pools_pending:
            self._open_pools()
        pool = pool or self._pool
        start = time.monotonic()
        if until is None:
            until = start + call_budget()
        wait_until = min(start + POOL_TIMEOUT, until)
        try:
            for attempt in range(pool.max_size + 1):
                if attempt or self._replacing.get(pool.name, 0.0) > time.monotonic():
                    _await_idle(pool, wait_until)
                left = wait_until - time.monotonic()
                if left <= 0:
                    raise StoreUnavailable(
                        f"PostgreSQL: no live connection within {POOL_TIMEOUT:.1f}s "
                        "(is the server up and answering?)")
                with _pooled(pool, wait_until) as conn:
                    try:
                        guard = Guard(conn, min(until, time.monotonic() + statement_budget()),
                                      close=True)
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
            waited = time.monotonic() - start
            raise StoreUnavailable(self._no_connection(pool, waited, exc)) from None
        raise StoreError("PostgreSQL: no live connection in the pool (is the server up?)")

    def _no_connection(self, pool: Pool, waited: float, exc: PoolTimeout) -> str:
        stats = pool.get_stats()
        text = f"PostgreSQL: no connection available after {waited:.1f}s ({exc})"
        if (pool is not self._pool or stats.get("pool_size", 0) < pool.max_size
                or stats.get("pool_available", 0)):
            return text + " (is the server up and answering?)"
        how = ("set by pool_size= / ?pool_max_size=" if self._fixed_size is not None
               else f"{POOL_ROOM} plus the task slots of this process's workers")
        return (f"{text}: all {pool.max_size} connections of the pool ({how}) are in use, by "
                "tasks holding transaction() and the app's own calls. Raise it: "
                "Conveyor(..., pool_size=N) or ?pool_max_size=N in the store URL (and keep it "
                "below the server's max_connections)")

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
                self._pool.resize(self._pool.min_size,
                                  max(POOL_ROOM + self._reserved, self._pool.min_size))
                return []
            if slots > 0 and self._fixed_size < self._reserved + 1:
                return [f"PostgreSQL pool_max_size={self._fixed_size} is not above the "
                        f"{self._reserved} task slots of this process's workers: tasks that "
                        "hold transaction() wait for a connection, and fail after "
                        f"{POOL_TIMEOUT:g}s without one. Leave the size unset (it follows the "
                        "workers' concurrency) or raise it"]
            return []

    @contextmanager
    def _tx(self, *, control: bool = False, until: float | None = None) -> Iterator[Conn]:
        """A transaction on a live connection of the main pool (or the control pool)."""
        try:
            with self._live_connection(self._control if control else None, until=until) as conn, \
                    conn.transaction():
                yield conn
        except psycopg.Error as exc:
            raise translate(exc) from exc
