"""History on PostgreSQL (backends/history.py): one table, conveyor_history (migration 016)."""

from __future__ import annotations

from collections.abc import Sequence

from ..history import FIELDS, HOUR, MINUTE, MINUTES_KEPT, HistoryPoint, check_points
from .connection import PooledBackend

_ADD = ", ".join(f"{f} = conveyor_history.{f} + excluded.{f}" for f in FIELDS)
_COLUMNS = ", ".join(FIELDS)

# One statement for the whole flush. Rows of one (queue, minute) are summed first: ON CONFLICT
# may not touch a row twice in one statement.
RECORD = f"""
INSERT INTO conveyor_history (span, bucket, queue, {_COLUMNS})
SELECT {MINUTE}, bucket, queue, sum(processed), sum(failed), sum(dead), sum(wait_sum),
       sum(run_sum)
FROM unnest(%(bucket)s::bigint[], %(queue)s::text[], %(processed)s::bigint[],
            %(failed)s::bigint[], %(dead)s::bigint[], %(wait_sum)s::float8[],
            %(run_sum)s::float8[]) AS r(bucket, queue, processed, failed, dead, wait_sum, run_sum)
GROUP BY bucket, queue
ORDER BY bucket, queue
ON CONFLICT (span, bucket, queue) DO UPDATE SET {_ADD}
"""

READ = f"""
SELECT span, bucket, queue, {_COLUMNS} FROM conveyor_history
WHERE span IN ({MINUTE}, {HOUR}) AND bucket >= %(since)s AND bucket < %(until)s
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
ORDER BY bucket, queue, span
"""

_T = "extract(epoch FROM coalesce(to_timestamp(%(now)s::float8), now()))"
# Delete the due minute rows and add them into their hours in one statement. FOR UPDATE: a
# flush adding to one of them waits, then finds it gone and inserts a fresh minute row, which
# the next roll-up takes (so nothing is lost in between).
ROLL_UP = f"""
WITH due AS (
    SELECT span, bucket, queue FROM conveyor_history
    WHERE span = {MINUTE} AND bucket < floor(({_T} - {MINUTES_KEPT}) / {HOUR}) * {HOUR}
    ORDER BY bucket, queue LIMIT %(limit)s FOR UPDATE
), gone AS (
    DELETE FROM conveyor_history h USING due
    WHERE h.span = due.span AND h.bucket = due.bucket AND h.queue = due.queue
    RETURNING h.*
), added AS (
    INSERT INTO conveyor_history (span, bucket, queue, {_COLUMNS})
    SELECT {HOUR}, bucket - bucket %% {HOUR} AS hour, queue,
           {", ".join(f"sum({f})" for f in FIELDS)}
    FROM gone GROUP BY hour, queue ORDER BY hour, queue
    ON CONFLICT (span, bucket, queue) DO UPDATE SET {_ADD}
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone) AS n, (SELECT count(*) FROM added) AS hours
"""
DELETE_OLD_HOURS = f"""
DELETE FROM conveyor_history h USING (
    SELECT span, bucket, queue FROM conveyor_history
    WHERE span = {HOUR} AND bucket < {_T} - %(keep)s
    ORDER BY bucket, queue LIMIT %(limit)s FOR UPDATE) AS old
WHERE h.span = old.span AND h.bucket = old.bucket AND h.queue = old.queue
"""


class PostgresHistory(PooledBackend):
    def record_history(self, points: Sequence[HistoryPoint]) -> None:
        check_points(points)
        if not points:
            return
        params = {"bucket": [p.at for p in points], "queue": [p.queue for p in points],
                  **{f: [getattr(p, f) for p in points] for f in FIELDS}}
        with self._tx() as conn:
            conn.execute(RECORD, params)

    def history(self, *, queue: str | None = None, since: float,
                until: float) -> list[HistoryPoint]:
        with self._tx() as conn:
            rows = conn.execute(READ, {"since": since, "until": until, "queue": queue}).fetchall()
        return [HistoryPoint(queue=r["queue"], at=int(r["bucket"]), span=int(r["span"]),
                             processed=int(r["processed"]), failed=int(r["failed"]),
                             dead=int(r["dead"]), wait_sum=float(r["wait_sum"]),
                             run_sum=float(r["run_sum"]))
                for r in rows]

    def rollup_history(self, *, keep_days: float, limit: int = 1000,
                       now: float | None = None) -> int:
        with self._tx() as conn:
            row = conn.execute(ROLL_UP, {"now": now, "limit": limit}).fetchone()
            old = conn.execute(DELETE_OLD_HOURS, {"now": now, "limit": limit,
                                                  "keep": keep_days * 86400.0}).rowcount
        return int(row["n"] if row else 0) + int(old)
