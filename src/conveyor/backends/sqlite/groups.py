"""Error groups, "make due" and cancel_many on SQLite (see Backend.error_groups,
Backend.make_due and Backend.cancel_many)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from ...errorgroups import MESSAGE_CHARS, ErrorGroups, Grouper
from .connection import Q

# The jobs looked at come from an index over their state: dead ones by conveyor_jobs_finished
# (state, finished_at), newest first; scheduled ones by conveyor_jobs_due (run_at). Rows with
# the same raw (task, type, message) are added up here; messages that differ only in ids are
# merged by the Grouper.
_ORDER = {"dead": "finished_at DESC", "scheduled": "run_at"}
GROUPS_SQL = """
SELECT task, json_extract(errors, '$[#-1].type') AS type,
       substr(json_extract(errors, '$[#-1].message'), 1, {chars}) AS message,
       count(*) AS n, min(json_extract(errors, '$[#-1].at')) AS first,
       max(json_extract(errors, '$[#-1].at')) AS last, max(id) AS sample
FROM (SELECT id, task, errors FROM conveyor_jobs
      WHERE state = :state AND (:queue IS NULL OR queue = :queue)
        AND (:task IS NULL OR task = :task) AND errors <> '[]'
      ORDER BY {order} LIMIT :scan)
GROUP BY 1, 2, 3
"""

MAKE_DUE_SQL = ("UPDATE conveyor_jobs SET state = 'available', run_at = :now"
                " WHERE id = :id AND state = 'scheduled'")


def error_groups(conn: sqlite3.Connection, state: str, queue: str | None, task: str | None,
                 limit: int, scan: int) -> ErrorGroups:
    sql = GROUPS_SQL.format(chars=MESSAGE_CHARS, order=_ORDER[state])
    rows = conn.execute(sql, {"state": state, "queue": queue, "task": task,
                              "scan": scan}).fetchall()
    grouper = Grouper()
    for r in rows:
        grouper.add(r["task"], r["type"], r["message"], r["n"], r["first"], r["last"],
                    r["sample"])
    return grouper.result(limit, complete=grouper.scanned < scan)


def make_due(conn: sqlite3.Connection, job_ids: Sequence[int], now: float) -> int:
    return sum(conn.execute(MAKE_DUE_SQL, {"id": int(i), "now": now}).rowcount
               for i in job_ids)


def cancel_many(conn: sqlite3.Connection, job_ids: Sequence[int],
                now: float) -> tuple[list[int], list[int]]:
    """Cancel the unfinished jobs among ``job_ids`` (ascending, distinct) inside the caller's
    write, as the ``cancel`` query does one: (the ids cancelled, those of them with children,
    whose settling the caller does next)."""
    done: list[int] = []
    parents: list[int] = []
    for i in job_ids:
        row = conn.execute(Q["cancel"], {"id": i, "now": now}).fetchone()
        if row is not None:
            done.append(i)
            if row[0]:
                parents.append(i)
    return done, parents
