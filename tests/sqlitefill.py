"""Big SQLite stores for plan and scale tests, filled in one statement (a recursive CTE).

Importable as ``sqlitefill`` (tests/ is on sys.path)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path


def fill_sqlite(path: Path, rows: int, *, scheduled: int, running: int) -> None:
    """``rows`` jobs: ``scheduled`` due over the next hour, ``running`` with leases expiring
    over the hour around now, the rest succeeded; then ANALYZE."""
    with sqlite3.connect(path) as conn:
        conn.execute(
            """
            WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < :rows)
            INSERT INTO conveyor_jobs (queue, task, args, state, run_at, attempt, max_attempts,
                                       timeout_s, lease_token, lease_expires_at, worker_id,
                                       attempted_at, finished_at, created_at)
            SELECT 'q' || (n % 8), 'app.work', '{}', s.state,
                   CASE WHEN s.state = 'scheduled' THEN :now + n % 3600 ELSE :now - 7200 END,
                   CASE WHEN s.state = 'scheduled' THEN 0 ELSE 1 END, 3, 60,
                   CASE WHEN s.state = 'running' THEN hex(n) END,
                   CASE WHEN s.state = 'running' THEN :now + n % 3600 - 1800 END,
                   CASE WHEN s.state = 'running' THEN 'w' END,
                   CASE WHEN s.state <> 'scheduled' THEN :now - 3600 END,
                   CASE WHEN s.state = 'succeeded' THEN :now - 1800 END, :now - 7200
            FROM (SELECT n, CASE WHEN n <= :scheduled THEN 'scheduled'
                                 WHEN n <= :scheduled + :running THEN 'running'
                                 ELSE 'succeeded' END AS state FROM g) AS s
            """,
            {"rows": rows, "scheduled": scheduled, "running": running, "now": time.time()})
        conn.execute("ANALYZE")
