"""The reaper's and the promoter's plans on PostgreSQL: with LIMIT n they read n rows from a
partial index in the order they need, never every expired lease or every due job plus a Sort.
A table big enough (and ANALYZEd) for the planner to weigh its choices; all scheduled jobs due
and all leases expired, the worst case for a plan that sorts."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pgschema import fill
from stores import postgres_store

from conveyor.backends.postgres import KEEP_ERRORS, PostgresBackend, Q

TABLE_READS = {"Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan", "Bitmap Index Scan"}
ROWS, SCHEDULED, RUNNING, LIMIT = 60_000, 10_000, 10_000, 100


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with postgres_store(Path(tmp_path_factory.mktemp("plans"))) as url:
        PostgresBackend(url).close()
        fill(url, ROWS, scheduled=SCHEDULED, running=RUNNING)
        yield url


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def analyzed(url: str, query: str) -> list[dict[str, Any]]:
    """Every node of the executed plan (rolled back: nothing changes)."""
    params = {"now": time.time() + 7200, "limit": LIMIT, "keep_errors": KEEP_ERRORS, "queue": "q1"}
    with psycopg.connect(url) as conn:
        doc = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + Q[query], params).fetchone()
        conn.rollback()
    assert doc is not None
    return list(nodes(doc[0][0]["Plan"]))


@pytest.mark.parametrize(("query", "index"), [
    ("reap", "conveyor_jobs_running"),
    ("promote", "conveyor_jobs_due"),
    ("promote_queue", "conveyor_jobs_scheduled"),
])
def test_reap_and_promote_read_limit_rows_from_their_index(url: str, query: str, index: str) -> None:
    plan = analyzed(url, query)
    # Every read of conveyor_jobs but the join back to the picked rows by primary key.
    scans = [n for n in plan if n["Node Type"] in TABLE_READS and n.get("Index Name") != "conveyor_jobs_pkey"]
    assert [(n["Node Type"], n.get("Index Name")) for n in scans] == [("Index Scan", index)], plan
    assert not [n for n in plan if "Sort" in n["Node Type"]], plan
    # O(limit): the scan stopped after the rows the LIMIT wanted (promote_queue: one queue's).
    assert scans[0]["Actual Rows"] <= LIMIT
