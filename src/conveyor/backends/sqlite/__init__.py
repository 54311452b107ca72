"""The embedded store: one SQLite file in WAL mode, safe for many threads and processes.

``connection`` opens the file (URL, WAL, one connection per thread, write lock, fork safety,
lock files), ``migrate`` brings its schema up to date, ``writes`` holds what the write
transactions do (enqueue, claim, ack, fair tags), and ``backend`` is SqliteBackend, the
Backend contract on top of them.
"""

from __future__ import annotations

from .backend import KEEP_ERRORS, SqliteBackend
from .connection import FORK_DRAIN_S, Q, SqliteConnections, parse_sqlite_url
from .migrate import MIGRATIONS

__all__ = [
    "FORK_DRAIN_S", "KEEP_ERRORS", "MIGRATIONS", "Q", "SqliteBackend", "SqliteConnections",
    "parse_sqlite_url",
]
