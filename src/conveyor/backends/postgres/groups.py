"""Error groups and "make due" on PostgreSQL (see Backend.error_groups and Backend.make_due)."""

from __future__ import annotations

from collections.abc import Sequence

from ...errorgroups import MESSAGE_CHARS, ErrorGroups, Grouper
from ...job import JobState
from ..base import ERROR_GROUP_SCAN, check_filters
from .connection import PooledBackend
from .queries import NOW, notify

# The jobs looked at come from an index over their state: dead ones by conveyor_jobs_finished
# (state, finished_at), newest first; scheduled ones by conveyor_jobs_due (run_at). Rows with
# the same raw (task, type, message) are added up by the GROUP BY; messages that differ only
# in ids are merged by the Grouper.
_ORDER = {"dead": "finished_at DESC", "scheduled": "run_at"}
GROUPS_SQL = """
SELECT task, errors -> -1 ->> 'type' AS type,
       left(errors -> -1 ->> 'message', {chars}) AS message,
       count(*) AS n, min((errors -> -1 ->> 'at')::float8) AS first,
       max((errors -> -1 ->> 'at')::float8) AS last, max(id) AS sample
FROM (SELECT id, task, errors FROM conveyor_jobs
      WHERE state = %(state)s AND (%(queue)s::text IS NULL OR queue = %(queue)s)
        AND (%(task)s::text IS NULL OR task = %(task)s) AND jsonb_array_length(errors) > 0
      ORDER BY {order} LIMIT %(scan)s) AS looked
GROUP BY 1, 2, 3
"""

MAKE_DUE_SQL = f"""
UPDATE conveyor_jobs SET state = 'available', run_at = {NOW}
WHERE id = ANY(%(ids)s) AND state = 'scheduled'
RETURNING queue
"""


class Grouping(PooledBackend):
    def error_groups(self, *, state: JobState = JobState.DEAD, queue: str | None = None,
                     task: str | None = None, limit: int = 100,
                     scan: int = ERROR_GROUP_SCAN) -> ErrorGroups:
        state = JobState(state)
        if state not in (JobState.DEAD, JobState.SCHEDULED):
            raise ValueError(f"error groups are of dead or scheduled jobs, not {state}")
        check_filters(queue=queue, task=task)
        sql = GROUPS_SQL.format(chars=MESSAGE_CHARS, order=_ORDER[str(state)])
        with self._tx() as conn:
            rows = conn.execute(sql.encode(), {"state": str(state), "queue": queue,
                                               "task": task, "scan": scan}).fetchall()
        grouper = Grouper()
        for r in rows:
            grouper.add(r["task"], r["type"], r["message"], r["n"], r["first"], r["last"],
                        r["sample"])
        return grouper.result(limit, complete=grouper.scanned < scan)

    def make_due(self, job_ids: Sequence[int], *, now: float | None = None) -> int:
        if not job_ids:
            return 0
        with self._tx() as conn:
            rows = conn.execute(MAKE_DUE_SQL.encode(),
                                {"ids": [int(i) for i in job_ids], "now": now}).fetchall()
            notify(conn, [r["queue"] for r in rows])
        return len(rows)
