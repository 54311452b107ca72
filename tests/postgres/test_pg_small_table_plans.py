"""The worker's hot statements reach jobs by primary key even when planned on a near-empty table.

psycopg prepares a statement after its fifth run, and PostgreSQL then keeps a generic plan made
with the table's statistics of that moment, until an ANALYZE replaces them (autovacuum: a
minute at best after enough rows changed). A worker started on an empty table (a new app, or
one whose jobs were pruned) plans there. A plan that reads ``conveyor_jobs`` whole is the
cheapest on an empty table, and it was kept while a burst grew the table: with the jobs locked
by ``WHERE id = ANY(ids) ... FOR NO KEY UPDATE``, every ack and heartbeat read the whole table,
and a worker offered 1,500 jobs/s fell further behind each second (p99 pick-up 0.3-0.7 s after
10 s, against 4 ms before those locks).

Each statement is planned here on a fresh, never-analyzed table (what a plan made there looks
like, generic or not) and must not scan ``conveyor_jobs``: it must find rows by an index.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from pgrig import fresh_schema

from conveyor.backends.postgres import PostgresBackend
from conveyor.backends.postgres.queries import Q, ack_claim_sql

IDS = [3, 1, 2]
TOKENS = ["t3", "t1", "t2"]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with fresh_schema() as url:  # skips locally, fails in CI, if PostgreSQL is unreachable
        PostgresBackend(url).close()  # the tables, migrated, and no row in them
        yield url


STATEMENTS: dict[str, tuple[str, dict[str, Any]]] = {
    "heartbeat": (Q["heartbeat"], {"ids": IDS, "tokens": TOKENS, "held": [], "lease_s": 30.0,
                                   "now": None}),
    "ack_many": (Q["ack_many"], {"ids": IDS, "tokens": TOKENS, "results": ["1", "1", "1"],
                                 "now": None}),
    "ack_claim": (ack_claim_sql(8).decode(), {
        "ids": IDS, "tokens": TOKENS, "results": ["1", "1", "1"], "now": None,
        "queue": "default", "worker_id": "w", "claim_id": "c" * 24, "lease_s": 30.0,
        "start": 8}),
    "release": (Q["release"], {"ids": IDS, "tokens": TOKENS}),
    "ack": (Q["ack"], {"id": 1, "token": "t1", "result": "1", "now": None}),
    "retry": (Q["retry"], {"id": 1, "token": "t1", "delay": 1.0, "error": "{}", "keep_errors": 20,
                           "now": None}),
    "kill": (Q["kill"], {"id": 1, "token": "t1", "error": "{}", "keep_errors": 20, "now": None}),
    "cancel_many": (Q["cancel_many"], {"ids": IDS, "now": None}),
    "link_parents": (Q["link_parents"], {"ids": IDS}),
    "mark_parent": (Q["mark_parent"], {"id": 1}),
    "claim_ids": (Q["claim_ids"], {"ids": IDS, "queue": "default", "worker_id": "w",
                                   "claim_id": "c" * 24, "lease_s": 30.0, "held_ids": [],
                                   "now": None}),
}


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_rows_are_found_by_index_on_an_empty_table(url: str, name: str) -> None:
    sql, params = STATEMENTS[name]
    with psycopg.connect(url) as conn:
        doc = conn.execute("EXPLAIN (FORMAT JSON) " + sql, params).fetchone()
        conn.rollback()
    assert doc is not None
    scans = [n for n in _nodes(doc[0][0]["Plan"])
             if n.get("Relation Name") == "conveyor_jobs" and n["Node Type"] == "Seq Scan"]
    assert not scans, f"{name} reads conveyor_jobs whole when planned on an empty table: {scans}"

