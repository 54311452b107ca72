"""History on SQLite (backends/history.py): one table, conveyor_history (migration 012)."""

from __future__ import annotations

from collections.abc import Sequence

from ..history import FIELDS, HOUR, MINUTE, HistoryPoint, check_points, rollup_cutoff
from .connection import SqliteConnections

_ADD = ", ".join(f"{f} = {f} + excluded.{f}" for f in FIELDS)
_COLUMNS = ", ".join(FIELDS)

RECORD = f"""
INSERT INTO conveyor_history (span, bucket, queue, {_COLUMNS})
VALUES ({MINUTE}, :at, :queue, :processed, :failed, :dead, :wait_sum, :run_sum)
ON CONFLICT (span, bucket, queue) DO UPDATE SET {_ADD}
"""

READ = f"""
SELECT span, bucket, queue, {_COLUMNS} FROM conveyor_history
WHERE span IN ({MINUTE}, {HOUR}) AND bucket >= :since AND bucket < :until
  AND (:queue IS NULL OR queue = :queue)
ORDER BY bucket, queue, span
"""

# The oldest minute rows due for rolling up, in key order: both statements below read the same
# rows, in one transaction. "WHERE true" lets SQLite parse ON CONFLICT after a SELECT.
_DUE = f"""
SELECT bucket, queue FROM conveyor_history
WHERE span = {MINUTE} AND bucket < :cutoff ORDER BY bucket, queue LIMIT :limit
"""
ROLL_UP = f"""
INSERT INTO conveyor_history (span, bucket, queue, {_COLUMNS})
SELECT {HOUR}, bucket - bucket % {HOUR} AS hour, queue,
       {", ".join(f"sum({f})" for f in FIELDS)}
FROM conveyor_history WHERE span = {MINUTE} AND (bucket, queue) IN ({_DUE})
GROUP BY hour, queue
ORDER BY hour, queue
ON CONFLICT (span, bucket, queue) DO UPDATE SET {_ADD}
"""
DELETE_ROLLED = f"""
DELETE FROM conveyor_history WHERE span = {MINUTE} AND (bucket, queue) IN ({_DUE})
"""
DELETE_OLD_HOURS = f"""
DELETE FROM conveyor_history WHERE span = {HOUR} AND (bucket, queue) IN (
    SELECT bucket, queue FROM conveyor_history
    WHERE span = {HOUR} AND bucket < :before ORDER BY bucket, queue LIMIT :limit)
"""


class SqliteHistory(SqliteConnections):
    def record_history(self, points: Sequence[HistoryPoint]) -> None:
        check_points(points)
        if not points:
            return
        rows = [{"at": p.at, "queue": p.queue, "processed": p.processed, "failed": p.failed,
                 "dead": p.dead, "wait_sum": p.wait_sum, "run_sum": p.run_sum} for p in points]
        with self._write(None) as (conn, _):
            conn.executemany(RECORD, rows)

    def history(self, *, queue: str | None = None, since: float,
                until: float) -> list[HistoryPoint]:
        rows = self._read(READ, {"since": since, "until": until, "queue": queue})
        return [HistoryPoint(queue=r["queue"], at=int(r["bucket"]), span=int(r["span"]),
                             processed=int(r["processed"]), failed=int(r["failed"]),
                             dead=int(r["dead"]), wait_sum=float(r["wait_sum"]),
                             run_sum=float(r["run_sum"]))
                for r in rows]

    def rollup_history(self, *, keep_days: float, limit: int = 1000,
                       now: float | None = None) -> int:
        with self._write(now) as (conn, t):
            due = {"cutoff": rollup_cutoff(t), "limit": limit}
            conn.execute(ROLL_UP, due)
            rolled = conn.execute(DELETE_ROLLED, due).rowcount
            old = conn.execute(DELETE_OLD_HOURS, {"before": t - keep_days * 86400.0,
                                                  "limit": limit}).rowcount
        return int(rolled) + int(old)
