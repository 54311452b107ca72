"""Telling an idle worker that another process wrote the database file, without polling it.

A commit by another process is seen by SQLite only when this process looks (``PRAGMA
data_version``). Looking every few milliseconds costs an idle worker hundreds of wake-ups a
second and still adds up to one interval to a job's pick-up. On Linux, inotify reports every
write to the WAL (a commit appends to it) and to the database file (a checkpoint) the moment
it happens: a thread per file and process blocks on it and nudges the idle waiters, who then
look. Where inotify is missing (another OS, a watch limit reached, a file system that does
not report) the waiters go on polling; a watch is only a faster way to be told.

The directory is watched, not the files: the WAL is made and deleted as connections come and
go, and a watch on a deleted file is gone with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import select
import struct
import sys
import threading
from collections.abc import Callable

log = logging.getLogger("conveyor.sqlite")

IN_MODIFY = 0x002
IN_CLOSE_WRITE = 0x008
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.inotify_init1  # noqa: B018 (raises AttributeError where there is none)
        libc.inotify_add_watch  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


class FileWatch:
    """Calls ``on_change`` (on its own thread) whenever the database file or its WAL is
    written, by any process. ``start`` returns None where that cannot be watched."""

    def __init__(self, fd: int, names: frozenset[bytes], on_change: Callable[[], None]) -> None:
        self._fd = fd
        self._names = names
        self._on_change = on_change
        # stop() writes to this pipe: the thread's select returns at once (closing a
        # descriptor another thread selects on does not wake it).
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="conveyor-sqlite-watch",
                                        daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, path: str, on_change: Callable[[], None]) -> FileWatch | None:
        libc = _libc()
        if libc is None:
            return None
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            log.info("SQLite %s: no inotify (%s); idle workers poll the file",
                     path, os.strerror(ctypes.get_errno()))
            return None
        directory, base = os.path.split(path)
        mask = IN_MODIFY | IN_CLOSE_WRITE | IN_CREATE | IN_MOVED_TO
        if libc.inotify_add_watch(fd, os.fsencode(directory or "."), mask) < 0:
            log.info("SQLite %s: cannot watch its directory (%s); idle workers poll the file",
                     path, os.strerror(ctypes.get_errno()))
            os.close(fd)
            return None
        name = os.fsencode(base)
        return cls(fd, frozenset({name, name + b"-wal"}), on_change)

    def _run(self) -> None:
        try:
            while not self._stopped:
                ready, _, _ = select.select([self._fd, self._stop_r], [], [])
                if self._stopped or self._stop_r in ready:
                    break
                try:
                    data = os.read(self._fd, 64 * 1024)
                except BlockingIOError:
                    continue
                if self._ours(data):
                    self._on_change()
        except Exception:
            log.exception("SQLite file watch failed; idle workers poll the file")
        finally:
            self._stopped = True
            for fd in (self._fd, self._stop_r, self._stop_w):
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _ours(self, data: bytes) -> bool:
        at = 0
        while at + _EVENT.size <= len(data):
            _, _, _, size = _EVENT.unpack_from(data, at)
            name = data[at + _EVENT.size:at + _EVENT.size + size].rstrip(b"\0")
            at += _EVENT.size + size
            if name in self._names:
                return True
        return False

    @property
    def alive(self) -> bool:
        return not self._stopped

    def stop(self) -> None:
        """End the thread; it closes the descriptors as it goes."""
        if self._stopped:
            return
        self._stopped = True
        with contextlib.suppress(OSError):
            os.write(self._stop_w, b"x")
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)

    def forget(self) -> None:
        """In a forked child: the thread is not in this process; close the copied
        descriptors."""
        self._stopped = True
        for fd in (self._fd, self._stop_r, self._stop_w):
            with contextlib.suppress(OSError):
                os.close(fd)
