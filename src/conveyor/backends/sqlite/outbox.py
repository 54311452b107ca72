"""A broker companion's outbox on SQLite (Backend.outbox_sweep): conveyor_outbox (migration 013)
holds the jobs whose message the broker has not confirmed, and since when."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from ...job import Job
from ..types import EnqueueResult
from .connection import Q, SqliteConnections
from .writes import row_to_job

MARK = "INSERT INTO conveyor_outbox (job_id, at) VALUES (?, ?) ON CONFLICT (job_id) DO UPDATE " \
       "SET at = excluded.at"
CONFIRM = "DELETE FROM conveyor_outbox WHERE job_id IN (SELECT value FROM json_each(?))"
DUE = """
SELECT o.job_id, j.state FROM conveyor_outbox o LEFT JOIN conveyor_jobs j ON j.id = o.job_id
WHERE o.at <= :cutoff ORDER BY o.at, o.job_id LIMIT :limit
"""
RENEW = "UPDATE conveyor_outbox SET at = ? WHERE job_id IN (SELECT value FROM json_each(?))"
WAITING = ("available", "scheduled")


def mark_created(conn: sqlite3.Connection, results: Sequence[EnqueueResult]) -> None:
    """Inside an enqueue's transaction: the jobs it created, marked at their write's time."""
    conn.executemany(MARK, [(r.id, r.at) for r in results if r.created])


class SqliteOutbox(SqliteConnections):
    def outbox_mark(self, job_ids: Sequence[int], *, now: float | None = None) -> None:
        if job_ids:
            with self._write(now) as (conn, t):
                conn.executemany(MARK, [(int(i), t) for i in job_ids])

    def outbox_confirm(self, job_ids: Sequence[int]) -> None:
        if job_ids:
            with self._write(None) as (conn, _):
                conn.execute(CONFIRM, (_ids(job_ids),))

    def outbox_sweep(self, *, older_than: float, limit: int = 100,
                     now: float | None = None) -> list[Job]:
        while True:  # past batches of marks that need no message (base.py)
            with self._write(now) as (conn, t):
                rows = conn.execute(DUE, {"cutoff": t - older_than, "limit": limit}).fetchall()
                due = sorted(r["job_id"] for r in rows if r["state"] in WAITING)
                gone = [r["job_id"] for r in rows if r["state"] not in WAITING]
                conn.execute(CONFIRM, (_ids(gone),))
                conn.execute(RENEW, (t, _ids(due)))
                jobs = [row_to_job(conn.execute(Q["get"], {"id": i}).fetchone()) for i in due]
            if jobs or len(rows) < limit:
                return jobs


def _ids(job_ids: Sequence[int]) -> str:
    return "[" + ",".join(str(int(i)) for i in job_ids) + "]"
