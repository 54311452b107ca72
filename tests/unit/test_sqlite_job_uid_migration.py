"""SQLite migration 007 (job uids) on a store made by an earlier version: rows from before keep
a NULL uid and still run, take step records and succeed; new jobs get a uid each."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sqlitefill import fill_sqlite

from conveyor.backends.base import Lease, NewJob
from conveyor.backends.sql import load_migrations, split_statements
from conveyor.backends.sqlite import SqliteBackend
from conveyor.executor import JobContext


def test_a_store_from_before_uids_keeps_working(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        for version, script in load_migrations("sqlite"):
            if version <= 4:
                for statement in split_statements(script):
                    conn.execute(statement)
        conn.execute("PRAGMA user_version = 4")
    fill_sqlite(path, 1_000, scheduled=0, running=0)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE conveyor_jobs SET state = 'available', finished_at = NULL, queue = 'old' WHERE id = 1")

    backend = SqliteBackend(f"sqlite:///{path}")
    try:
        assert backend.schema_version() >= 7
        [old] = backend.claim("old", 1, worker_id="w", lease_s=30)
        assert old.uid is None
        assert JobContext(old, backend).once("charge", lambda: "ch_old") == "ch_old"
        backend.ack(Lease(old.id, old.lease_token or ""), None)
        done = backend.get(old.id)
        assert done is not None and done.state == "succeeded" and done.steps == {"charge": "ch_old"}
        made = backend.enqueue_many([NewJob(task="app.work", queue="new", args="{}", max_attempts=1, timeout=5)] * 3)
        uids = [m.uid for m in made]
        assert len(set(uids)) == 3 and all(u is not None and len(u) == 32 for u in uids)
        assert [backend.get(m.id).uid for m in made] == uids  # type: ignore[union-attr]
    finally:
        backend.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM conveyor_jobs WHERE uid IS NULL").fetchone() == (1_000,)
