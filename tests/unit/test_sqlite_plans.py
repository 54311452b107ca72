"""The reaper's and the promoter's plans on SQLite: each reads its partial index in the order it
needs (LIMIT n reads n entries), never a skip-scan of every queue plus a temporary B-tree to
sort all due jobs. A table big enough, and ANALYZEd, for the planner to weigh its choices."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from sqlitefill import fill_sqlite

from conveyor.backends.sqlite import KEEP_ERRORS, Q, SqliteBackend

ROWS, SCHEDULED, RUNNING = 60_000, 10_000, 10_000


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = Path(tmp_path_factory.mktemp("plans")) / "c.db"
    SqliteBackend(f"sqlite:///{path}").close()
    fill_sqlite(path, ROWS, scheduled=SCHEDULED, running=RUNNING)
    return path


@pytest.mark.parametrize(("query", "index"), [
    ("reap", "conveyor_jobs_running"),
    ("promote", "conveyor_jobs_due"),
    ("promote_queue", "conveyor_jobs_scheduled"),
])
def test_reap_and_promote_read_their_index_in_order(db: Path, query: str, index: str) -> None:
    params = {"now": time.time() + 7200, "limit": 100, "keep_errors": KEEP_ERRORS, "queue": "q1"}
    with sqlite3.connect(db) as conn:
        plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + Q[query], params)]
    reads = [step for step in plan if step.startswith(("SCAN", "SEARCH")) and "PRIMARY KEY" not in step]
    assert len(reads) == 1 and f"USING INDEX {index} " in reads[0], plan
    assert not [step for step in plan if "TEMP B-TREE" in step], plan
