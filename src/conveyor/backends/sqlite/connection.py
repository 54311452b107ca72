"""SQLite files and connections: the store's URL, one connection per thread in WAL mode, write
transactions queued on a lock of this process's (with the group of enqueues waiting for it),
the signal that wakes this process's idle workers, fork safety, and the lock files beside the
database."""

from __future__ import annotations

import fcntl
import logging
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ...errors import ConfigurationError, StorageFull, StoreError
from .. import forking
from ..base import EnqueueResult, NewBatch, NewJob, StoreLock, check_lock_name
from ..sql import load_queries
from .filewatch import FileWatch
from .migrate import migrate
from .turns import WriteTurns

log = logging.getLogger("conveyor.sqlite")
Q = load_queries("sqlite")  # the named statements of sql/sqlite/queries.sql



@dataclass
class _Signal:
    """Per database file and process: wakes idle workers when this process makes jobs
    available, and queues this process's writers on a lock of our own, because SQLite's
    busy handler waits by sleeping (up to 100 ms a nap) where a lock hands over at once."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    generation: int = 0
    write_lock: threading.Lock = field(default_factory=threading.Lock)
    # job.wait: the ids waited for in this process (id -> waiters), and the condition their
    # waiters sleep on. Finishing a job costs a look at this dict, nothing more, while empty.
    waited: dict[int, int] = field(default_factory=dict)
    finish_cond: threading.Condition = field(default_factory=threading.Condition)
    finishes: int = 0  # bumped by every wake-up of finish_cond: a waiter misses none

    # Bumped when the file was written, by any process (filewatch.py): idle waiters look.
    changes: int = 0
    # The file's watch (filewatch.py): one per file and process, shared by every backend on
    # the file that has waited idle (a _WatchUse each), stopped when the last lets go. One per
    # backend would spend a thread and an inotify instance (128 per user by default) on each.
    watch: FileWatch | None = None
    watch_users: int = 0
    watch_tried: bool = False  # (a start that failed is not tried again while users remain)
    watch_lock: threading.Lock = field(default_factory=threading.Lock)

    def fire(self) -> None:
        with self.cond:
            self.generation += 1
            self.cond.notify_all()

    def nudge(self) -> None:
        with self.cond:
            self.changes += 1
            self.cond.notify_all()

    def use_watch(self, path: str) -> _WatchUse:
        """Count one more user of the file's watch, starting it if none runs."""
        with self.watch_lock:
            self.watch_users += 1
            if self.watch is None and not self.watch_tried:
                self.watch_tried = True
                self.watch = FileWatch.start(path, self.nudge)
        return _WatchUse(self)

    def _unwatch(self) -> None:
        with self.watch_lock:
            self.watch_users -= 1
            if self.watch_users > 0:
                return
            watch, self.watch, self.watch_tried = self.watch, None, False
        if watch is not None:
            watch.stop()

    @property
    def watched(self) -> bool:
        watch = self.watch
        return watch is not None and watch.alive

    def finished(self, job_ids: Iterable[int]) -> None:
        """Jobs of this file reached a final state in this process: wake their waiters."""
        waited = self.waited
        if waited and not waited.keys().isdisjoint(job_ids):
            with self.finish_cond:
                self.finishes += 1
                self.finish_cond.notify_all()


class _WatchUse:
    """One backend's use of its file's watch: let go once, at close or when the backend is
    collected unclosed, whichever comes first."""

    def __init__(self, signal: _Signal) -> None:
        self._signal: _Signal | None = signal

    def release(self) -> None:
        signal, self._signal = self._signal, None
        if signal is not None:
            signal._unwatch()


@dataclass
class EnqueueGroup:
    """Enqueue calls written together in one transaction: one commit, one sync (group commit).
    The first call to come leads: it writes them all once it holds the write lock, and every
    call that comes while it waits for the lock joins its group."""

    calls: list[tuple[Sequence[NewJob], float | None, Sequence[NewBatch]]] = field(
        default_factory=list)
    results: list[list[EnqueueResult] | BaseException] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)


_signals: dict[str, _Signal] = {}
_signals_lock = threading.Lock()


def _signal_for(path: str) -> _Signal:
    with _signals_lock:
        return _signals.setdefault(path, _Signal())


def _fresh_signals() -> None:
    # A forked child's copies may be held (a writer of the parent's, mid-transaction) by a
    # thread that does not exist here: it would wait on them for ever. Their watches' threads
    # are the parent's: the child closes its copies of their descriptors.
    global _signals, _signals_lock
    for signal in _signals.values():
        if signal.watch is not None:
            signal.watch.forget()
    _signals, _signals_lock = {}, threading.Lock()


forking.on_fork_in_child(_fresh_signals)

# Every live backend of the process, for the fork hooks (see SqliteConnections._before_fork).
_backends: weakref.WeakSet[SqliteConnections] = weakref.WeakSet()
# A fork waits this long at most for the calls in progress (each within busy_timeout).
FORK_DRAIN_S = 60.0


def _before_fork() -> None:
    for backend in list(_backends):
        backend._before_fork()


def _after_fork_in_parent() -> None:
    for backend in list(_backends):
        backend._after_fork_in_parent()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent)


def parse_sqlite_url(url: str) -> tuple[str, dict[str, str]]:
    """``sqlite:///relative.db``, ``sqlite:////abs/path.db``, optional
    ``?synchronous=full&busy_timeout=10``."""
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
        raise ConfigurationError(
            f"{url!r}: unknown option(s) {sorted(unknown)}; known: synchronous, busy_timeout")
    return os.path.abspath(path), options



class SqliteConnections:
    """The files and connections of one SQLite store; SqliteBackend adds the job operations."""

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
        self._group: EnqueueGroup | None = None  # enqueues waiting for the write lock
        self._group_lock = threading.Lock()
        self._signal = _signal_for(self.path)
        # This backend's use of the file's watch (_Signal.use_watch), which tells idle waiters
        # of other processes' writes: taken by the first idle wait, let go at close.
        self._watch_use: _WatchUse | None = None
        self._locks: set[_FileLock] = set()  # store-wide locks this backend holds (try_lock)
        # Writers of other processes take fair turns; half the busy timeout at most, so a turn
        # held by a stopped process leaves SQLite's own wait its time within the bound.
        self._turns = WriteTurns(self.path, self._busy_timeout / 2)
        migrate(self)
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
                    self.path, timeout=self._busy_timeout, isolation_level=None,
                    check_same_thread=False,
                )
                conn.row_factory = sqlite3.Row
                self._enter_wal(conn)
                conn.execute(f"PRAGMA synchronous = {self._synchronous}")
                # A checkpointed WAL is cut back to this size instead of keeping its peak forever.
                conn.execute("PRAGMA journal_size_limit = 16777216")
            except sqlite3.Error as exc:
                raise translate(exc, f"cannot open SQLite database {self.path}") from exc
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
            f"SQLite cannot use WAL mode for {self.path} ({why}). Conveyor needs it: SQLite "
            f"keeps {name}-wal and {name}-shm beside the database, so {folder} must be writable, "
            "and on a local file system (not NFS, SMB or another network file system, nor a "
            "read-only mount)"
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
                log.warning("SQLite %s: a call was still running when the process forked; the "
                            "child must not use this store", self.path)
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
        # Its turn files' descriptors share the parent's flocks: an unlock here would free them.
        forking.keep_inherited(self._turns)
        self._turns = WriteTurns(self.path, self._busy_timeout / 2)
        self._local = threading.local()
        self._all, self._in_use = [], {}
        self._lock = threading.Condition(threading.Lock())
        self._calls, self._forking = 0, False
        self._group, self._group_lock = None, threading.Lock()
        self._signal = _signal_for(self.path)
        # Its use was of the parent's signal (whose watch _fresh_signals forgot): a new wait
        # uses the child's own.
        self._watch_use = None

    @property
    def closed(self) -> bool:
        return self._closed

    def _watching(self) -> bool:
        """Whether other processes' writes to the file wake this process's idle waiters (the
        watch is made on the first call)."""
        if self._watch_use is None and not self._closed:
            with self._lock:
                if self._watch_use is None and not self._closed:
                    use = self._watch_use = self._signal.use_watch(self.path)
                    # A backend nobody closed lets go of the watch when it is collected.
                    weakref.finalize(self, use.release)
        return self._signal.watched

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
        """One write transaction, with the store's time read once at its start. Writers of this
        process queue on its write lock, then take their turn among other processes' (turns)."""
        with self._using() as conn, self._signal.write_lock, self._turns.turn():
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise translate(exc, "cannot start a write transaction") from exc
            try:
                t = now if now is not None else conn.execute(Q["now"]).fetchone()[0]
                yield conn, t
                conn.execute("COMMIT")
            except BaseException as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise translate(exc, "write failed, nothing was changed") from exc
                raise

    def _read(self, sql: str, params: dict[str, Any] | Sequence[Any] = ()) -> list[sqlite3.Row]:
        try:
            with self._using() as conn:
                return conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise translate(exc, "read failed") from exc

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._all = self._all, []
            idle = [c for c in conns if c not in self._in_use]
            locks, self._locks = self._locks, set()
        for held in locks:
            held.release()
        self._turns.close()
        use, self._watch_use = self._watch_use, None
        if use is not None:
            use.release()
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


def translate(exc: sqlite3.Error, what: str) -> StoreError:
    text = str(exc)
    if "full" in text.lower():
        return StorageFull(f"SQLite: {what}: {text} (free disk space; nothing was written)")
    return StoreError(f"SQLite: {what}: {text}")


class _FileLock(StoreLock):
    """An open file with an exclusive ``flock``: closing the file lets go of it."""

    def __init__(self, fd: int, owner: SqliteConnections) -> None:
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
