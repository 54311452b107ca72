"""Writers of one SQLite file take turns across processes.

SQLite's write lock is no queue: a writer that finds it taken sleeps in SQLite's busy handler
(naps growing to 100 ms) and tries again, while a writer in another process that commits and
begins again takes the lock back within microseconds. A process writing back to back (a
producer enqueuing one job at a time) can so keep a worker in another process from claiming
for seconds. Two ``flock`` files beside the database make the turns fair: a writer takes the
door, then the turn, and lets go of the door; one that gives the turn back and wants it again
finds the door held by a writer already waiting for the turn, and goes after it. The operating
system wakes a waiter the moment a lock is let go, and frees both when their holder exits.

Only a queue in front of SQLite's lock, which still decides who writes: where the files
cannot be opened or locked, writers go straight to SQLite's lock, as do processes of older
versions that know nothing of the files (they only lose their fairness).

Every wait here is bounded (``wait_s``, the store's busy_timeout): a holder that stopped
(SIGSTOP, a debugger) or hangs must not hold every other writer past the bound its call
promises. A lock is polled without blocking, a few hundred microseconds apart at first, and at
the deadline the writer goes on to SQLite's lock, whose own busy_timeout then says how long it
waited.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("conveyor.sqlite")


class WriteTurns:
    """One backend's descriptors of the two files. Used under the process's own write lock,
    so one thread at a time takes turns through them."""

    def __init__(self, path: str, wait_s: float = 30.0) -> None:
        self._names = (f"{path}-writers.door", f"{path}-writers.turn")
        self._wait_s = wait_s
        self._fds: tuple[int, int] | None = None
        self._tried = False
        self._mutex = threading.Lock()
        self._users = 0  # turns in progress: close() leaves the descriptors to the last one
        self._closed = False

    def _open(self) -> tuple[int, int] | None:
        if not self._tried:
            self._tried = True
            fds: list[int] = []
            try:
                for name in self._names:
                    fds.append(os.open(name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644))
            except OSError as exc:
                for fd in fds:
                    os.close(fd)
                log.info("SQLite writers do not take turns across processes (%s); they wait "
                         "on SQLite's lock alone", exc)
            else:
                self._fds = (fds[0], fds[1])
        return self._fds

    @contextmanager
    def turn(self) -> Iterator[None]:
        with self._mutex:
            fds = None if self._closed else self._open()
            if fds is not None:
                self._users += 1
        if fds is None:
            yield
            return
        door, turn = fds
        held = False
        try:
            try:
                deadline = time.monotonic() + self._wait_s
                if _lock(door, deadline):
                    try:
                        held = _lock(turn, deadline)
                    finally:
                        fcntl.flock(door, fcntl.LOCK_UN)
                if not held:
                    log.warning("waited %.0f s for a SQLite write turn (a writer of another "
                                "process holds it: stopped or hung?); going on to SQLite's "
                                "lock", self._wait_s)
            except OSError as exc:  # no locks on this file system: SQLite's lock alone
                log.debug("taking a write turn failed: %s", exc)
            yield
        finally:
            if held:
                fcntl.flock(turn, fcntl.LOCK_UN)
            with self._mutex:
                self._users -= 1
                if self._closed and not self._users:
                    self._close_fds()

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            if not self._users:
                self._close_fds()

    def _close_fds(self) -> None:
        fds, self._fds = self._fds, None
        for fd in fds or ():
            os.close(fd)


def _lock(fd: int, deadline: float) -> bool:
    """Take ``fd``'s exclusive flock before ``deadline`` (monotonic); False if it stayed taken.
    Polled: a blocking flock has no timeout."""
    pause = 0.0002
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.002)
