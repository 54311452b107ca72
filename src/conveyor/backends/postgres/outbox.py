"""A broker companion's outbox on PostgreSQL (Backend.outbox_sweep): conveyor_outbox (migration
017) holds the jobs whose message the broker has not confirmed, and since when (unix seconds)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from ...job import Job
from ..types import EnqueueResult
from .connection import PooledBackend
from .queries import NOW, Q, row_to_job

EPOCH = f"extract(epoch FROM {NOW})::float8"
MARK = """
INSERT INTO conveyor_outbox (job_id, at) SELECT * FROM unnest(%(ids)s::bigint[], %(ats)s::float8[])
ON CONFLICT (job_id) DO UPDATE SET at = excluded.at
"""
MARK_NOW = f"""
INSERT INTO conveyor_outbox (job_id, at) SELECT unnest(%(ids)s::bigint[]), {EPOCH}
ON CONFLICT (job_id) DO UPDATE SET at = excluded.at
"""
CONFIRM = "DELETE FROM conveyor_outbox WHERE job_id = ANY(%(ids)s::bigint[])"
# The marks due, locked: two sweeps at once (without the companion's lock) share them out.
DUE = f"""
SELECT o.job_id, j.state::text AS state, {EPOCH} AS now
FROM conveyor_outbox AS o LEFT JOIN conveyor_jobs AS j ON j.id = o.job_id
WHERE o.at <= {EPOCH} - %(older_than)s::float8
ORDER BY o.at, o.job_id LIMIT %(limit)s
FOR UPDATE OF o SKIP LOCKED
"""
RENEW = "UPDATE conveyor_outbox SET at = %(at)s WHERE job_id = ANY(%(ids)s::bigint[])"
WAITING = ("available", "scheduled")
SCAN_MAX = 10_000  # marks one sweep write looks at, at most


def mark_created(conn: psycopg.Connection[Any], results: Sequence[EnqueueResult]) -> None:
    """Inside an enqueue's transaction: the jobs it created, marked at their write's time."""
    made = [r for r in results if r.created]
    if made:
        conn.execute(MARK, {"ids": [r.id for r in made], "ats": [r.at for r in made]})


class PostgresOutbox(PooledBackend):
    def outbox_mark(self, job_ids: Sequence[int], *, now: float | None = None) -> None:
        if job_ids:
            with self._tx() as conn:
                conn.execute(MARK_NOW, {"ids": [int(i) for i in job_ids], "now": now})

    def outbox_confirm(self, job_ids: Sequence[int]) -> None:
        if job_ids:
            with self._tx() as conn:
                conn.execute(CONFIRM, {"ids": [int(i) for i in job_ids]})

    def outbox_sweep(self, *, older_than: float, limit: int = 100,
                     now: float | None = None) -> list[Job]:
        scan = limit
        while True:  # past batches of marks that need no message (base.py)
            with self._tx() as conn:
                rows = conn.execute(DUE, {"older_than": older_than, "limit": scan,
                                          "now": now}).fetchall()
                if not rows:
                    return []
                # The first `limit` marks that need a message, in mark order; every mark
                # looked at that needs none is cleared, those further in too.
                due = [r["job_id"] for r in rows if r["state"] in WAITING][:limit]
                gone = [r["job_id"] for r in rows if r["state"] not in WAITING]
                if gone:
                    conn.execute(CONFIRM, {"ids": gone})
                if due:
                    conn.execute(RENEW, {"at": rows[0]["now"], "ids": due})
                    jobs = []
                    for i in sorted(due):
                        row = conn.execute(Q["get"], {"id": i}).fetchone()
                        if row is not None:
                            jobs.append(row_to_job(row))
                    return jobs
            if len(rows) < scan:
                return []
            # A whole batch needed no message: a backlog of such marks. Look further at a time
            # (a commit per batch is most of a batch's cost), bounded to keep a write short.
            scan = min(scan * 4, SCAN_MAX)
