"""The SQLite schema: the numbered scripts of sql/sqlite, applied in order at open. The file's
``user_version`` is the number of the last script applied."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from ...errors import StoreError
from ..sql import load_migrations
from ..sql import split_statements as _split_sql

if TYPE_CHECKING:
    from .connection import SqliteConnections

MIGRATIONS = load_migrations("sqlite")


def migrate(store: SqliteConnections) -> None:
    """Apply the scripts the file has not had yet."""
    # In a write transaction even when there is nothing to migrate: a store SQLite can read
    # but not write (its WAL index cannot be written: see _no_wal) fails here, at open, and
    # not at the first enqueue. It commits nothing then, so it costs no sync.
    try:
        with store._write(None) as (c, _):
            current = c.execute("PRAGMA user_version").fetchone()[0]
            for version, script in MIGRATIONS:
                if version <= current:
                    continue
                for statement in _split_sql(script):
                    c.execute(statement)
                c.execute(f"PRAGMA user_version = {version}")
    except StoreError as exc:
        cause = exc.__cause__
        if isinstance(cause, sqlite3.Error) and (
                cause.sqlite_errorname or "").startswith("SQLITE_READONLY"):
            raise store._no_wal(str(cause)) from cause
        raise

