"""Production shape: the reaper and the promoter on a big conveyor_jobs (PostgreSQL, SQLite).

Mostly succeeded jobs, a tenth scheduled (all due) and a tenth running (all leases expired):
the worst case for a plan that reads every candidate and sorts. Each statement, with LIMIT 100,
must read about 100 rows of its index whatever the table holds. The figures: buffers and rows
read by the pick of each (and by the whole statement, with the update of 100 rows and their
index entries), with the migration's index (after) and without it (before: dropped inside a
transaction that is rolled back). SQLite has no buffer counts: its figures are the plan and
the wall time of each statement, with and without the index.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import psycopg
import pytest
from pgschema import fill
from scalekit import report, size
from sqlitefill import fill_sqlite
from stores import postgres_store

from conveyor.backends.postgres import KEEP_ERRORS, PostgresBackend, Q
from conveyor.backends.sqlite import KEEP_ERRORS as SQLITE_KEEP_ERRORS
from conveyor.backends.sqlite import Q as SQLITE_Q
from conveyor.backends.sqlite import SqliteBackend

ROWS = size(100_000, 1_000_000)
LIMIT = 100
TABLE_READS = {"Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan", "Bitmap Index Scan"}


def measure(conn: psycopg.Connection[Any], query: str) -> dict[str, Any]:
    params = {"now": time.time() + 7200, "limit": LIMIT, "keep_errors": KEEP_ERRORS, "queue": "q1"}
    doc = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + Q[query], params).fetchone()
    assert doc is not None
    top = doc[0][0]
    plan: list[dict[str, Any]] = []
    todo = [top["Plan"]]
    while todo:
        node = todo.pop()
        plan.append(node)
        todo += node.get("Plans", [])
    reads = [n for n in plan if n["Node Type"] in TABLE_READS and n.get("Index Name") != "conveyor_jobs_pkey"]
    # The pick (the CTE choosing the rows) apart from the update of the rows picked.
    pick = next(n for n in plan if str(n.get("Subplan Name", "")).startswith("CTE"))
    return {"pick_buffers": pick["Shared Hit Blocks"] + pick["Shared Read Blocks"],
            "all_buffers": top["Plan"]["Shared Hit Blocks"] + top["Plan"]["Shared Read Blocks"],
            "rows_read": max(n["Actual Rows"] for n in reads),
            "index": ",".join(sorted({n.get("Index Name") or n["Node Type"] for n in reads})),
            "sorted": any("Sort" in n["Node Type"] for n in plan),
            "ms": round(top["Execution Time"], 1)}


@pytest.mark.timeout(3600)
def test_pg_reap_and_promote_read_limit_rows_at_scale(tmp_path) -> None:
    with postgres_store(tmp_path) as url:
        PostgresBackend(url).close()
        fill(url, ROWS, scheduled=ROWS // 10, running=ROWS // 10)
        figures: dict[str, Any] = {}
        with psycopg.connect(url) as conn:
            for query in ("reap", "promote"):
                after = measure(conn, query)
                conn.rollback()
                assert not after["sorted"] and after["rows_read"] <= LIMIT, after
                figures.update({f"{query}_{k}": v for k, v in after.items()})
            conn.execute("DROP INDEX conveyor_jobs_due")  # rolled back below
            figures.update({f"promote_before_{k}": v for k, v in measure(conn, "promote").items()})
            conn.rollback()
    report("pg_reap_promote_plans", "postgres", rows=ROWS, scheduled_due=ROWS // 10,
           running_expired=ROWS // 10, limit=LIMIT, **figures)


def sqlite_run(conn: sqlite3.Connection, query: str) -> tuple[list[str], float, int]:
    """The plan, the best wall time of three runs and the rows changed, each run in a savepoint
    rolled back (inside the caller's transaction): the first run pays for a cold page cache."""
    params = {"now": time.time() + 7200, "limit": LIMIT, "keep_errors": SQLITE_KEEP_ERRORS, "queue": "q1"}
    plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + SQLITE_Q[query], params)]
    best, changed = float("inf"), 0
    for _ in range(3):
        conn.execute("SAVEPOINT run")
        t0 = time.perf_counter()
        cur = conn.execute(SQLITE_Q[query], params)
        cur.fetchall()  # a statement with RETURNING counts its rows as they are read
        best, changed = min(best, time.perf_counter() - t0), cur.rowcount
        conn.execute("ROLLBACK TO run")
        conn.execute("RELEASE run")
    return plan, best, changed


@pytest.mark.timeout(3600)
def test_sqlite_reap_and_promote_read_limit_rows_at_scale(tmp_path) -> None:
    path = tmp_path / "c.db"
    SqliteBackend(f"sqlite:///{path}").close()
    fill_sqlite(path, ROWS, scheduled=ROWS // 10, running=ROWS // 10)
    figures: dict[str, Any] = {}
    # Transactions by hand, all rolled back; no statement cache: the plan after DROP INDEX is new.
    conn = sqlite3.connect(path, isolation_level=None, cached_statements=0)
    try:
        for query, index in (("reap", "conveyor_jobs_running"), ("promote", "conveyor_jobs_due")):
            conn.execute("BEGIN")
            plan, took, changed = sqlite_run(conn, query)
            conn.execute("ROLLBACK")
            assert changed == LIMIT and not [s for s in plan if "TEMP B-TREE" in s], plan
            assert any(f"USING INDEX {index} " in s for s in plan), plan
            figures[f"{query}_after_ms"] = round(took * 1000, 1)
        conn.execute("BEGIN")
        conn.execute("DROP INDEX conveyor_jobs_due")
        plan, took, _ = sqlite_run(conn, "promote")
        conn.execute("ROLLBACK")
        figures["promote_before_ms"] = round(took * 1000, 1)
        figures["promote_before_plan"] = "; ".join(plan)
    finally:
        conn.close()
    report("sqlite_reap_promote_plans", "sqlite", rows=ROWS, scheduled_due=ROWS // 10,
           running_expired=ROWS // 10, limit=LIMIT, **figures)
