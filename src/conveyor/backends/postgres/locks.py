"""Store-wide locks on PostgreSQL: session advisory locks, each on a connection of its own."""

from __future__ import annotations

import threading
import time
from contextlib import suppress

import psycopg
from psycopg.rows import dict_row

from ...errors import StoreError
from ..base import StoreLock, check_lock_name
from .connection import Conn, Guard, PooledBackend, bounded, call_budget, configure, translate
from .queries import TRY_LOCK


class Locking(PooledBackend):
    """try_lock of PostgresBackend."""

    _locks: set[_SessionLock]  # store-wide locks this backend holds
    _locks_mutex: threading.Lock

    def try_lock(self, name: str, *, ttl: float) -> StoreLock | None:
        """A session advisory lock (``pg_try_advisory_lock``, keyed by the name and the schema)
        on a connection of its own, held until released: the server drops it when that
        connection ends, so a holder that dies frees it at once and ``ttl`` is not needed."""
        key = f"conveyor_lock:{check_lock_name(name)}:"
        try:
            # Bounded by connect_timeout.
            conn = psycopg.connect(self._conninfo, autocommit=True, row_factory=dict_row)
        except psycopg.Error as exc:
            raise translate(exc) from exc
        try:
            with Guard(conn, time.monotonic() + call_budget(), close=True):
                configure(conn)
                row = conn.execute(TRY_LOCK, [key]).fetchone()
        except psycopg.Error as exc:
            conn.close()
            raise translate(exc) from exc
        if row is None or not row["held"]:
            conn.close()
            return None
        held = _SessionLock(conn, self)
        with self._locks_mutex:
            self._locks.add(held)
        return held

    def _release_locks(self) -> None:
        with self._locks_mutex:
            locks, self._locks = self._locks, set()
        for held in locks:
            held.release()


class _SessionLock(StoreLock):
    """A session advisory lock and the connection that holds it: closing it lets go."""

    def __init__(self, conn: Conn, owner: Locking) -> None:
        self._conn: Conn | None = conn
        self._owner = owner
        self._mutex = threading.Lock()

    def renew(self) -> bool:
        """Held while its session lives: one round trip says so."""
        with self._mutex:
            conn = self._conn
            if conn is None:
                return False
            try:
                with bounded(conn, close=True):
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
