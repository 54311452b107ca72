"""SQLite workflows beyond the conformance tests: migration 008 on a store written by the
version before it, the statements an ordinary ack costs, and a chain longer than SQLite's
trigger depth or Python's recursion limit."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlitefill import fill_sqlite
from support import T0, new_job

from conveyor.backends.base import ErrorInfo, Lease, NewBatch
from conveyor.backends.sql import load_migrations, split_statements
from conveyor.backends.sqlite import SqliteBackend
from conveyor.job import JobState


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[SqliteBackend]:
    b = SqliteBackend(f"sqlite:///{tmp_path}/c.db")
    yield b
    b.close()


def test_migration_008_keeps_the_jobs_of_a_store_from_before(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        for version, script in load_migrations("sqlite"):
            if version <= 7:
                for statement in split_statements(script):
                    conn.execute(statement)
        conn.execute("PRAGMA user_version = 7")
    fill_sqlite(path, 2_000, scheduled=0, running=0)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE conveyor_jobs SET state = 'available', finished_at = NULL,"
                     " queue = 'old', unique_key = 'k' WHERE id = 1")
        pages_before = conn.execute("PRAGMA page_count").fetchone()[0]

    backend = SqliteBackend(f"sqlite:///{path}")
    try:
        assert backend.schema_version() == load_migrations("sqlite")[-1][0]  # 008 and after
        old = backend.get(1)
        assert old is not None and old.state is JobState.AVAILABLE and old.parents == ()
        assert old.on_parent_failure == "cancel" and old.batch_id is None
        # The old job is a parent like any other, and still holds its unique key.
        [dup, child] = backend.enqueue_many(
            [new_job(queue="old", unique_key="k"), new_job(after_refs=(0,), queue="new")],
            now=T0)
        assert dup.id == 1 and not dup.created
        assert backend.get(child.id).state is JobState.WAITING  # type: ignore[union-attr]
        [claimed] = backend.claim("old", 5, worker_id="w", lease_s=30, now=T0)
        backend.ack(Lease(1, claimed.lease_token or ""), None, now=T0 + 1)
        assert backend.get(child.id).state is JobState.AVAILABLE  # type: ignore[union-attr]
    finally:
        backend.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("SELECT count(*) FROM conveyor_jobs").fetchone() == (2_001,)
        # Columns and constraints changed in the schema only: no copy of the table was made.
        assert conn.execute("PRAGMA page_count").fetchone()[0] < pages_before + 20


def test_an_ordinary_ack_costs_no_statement_more(backend: SqliteBackend) -> None:
    ids = [r.id for r in backend.enqueue_many([new_job(), new_job()], now=T0)]
    backend.enqueue_many([new_job(after=(ids[1],))], now=T0)
    claimed = {j.id: j for j in backend.claim("default", 2, worker_id="w", lease_s=30, now=T0)}
    statements: list[str] = []
    conn = backend._conn()  # this thread's connection: the one ack writes on
    conn.set_trace_callback(statements.append)
    try:
        backend.ack(Lease(ids[0], claimed[ids[0]].lease_token or ""), None, now=T0 + 1)
        ordinary = list(statements)
        statements.clear()
        backend.ack(Lease(ids[1], claimed[ids[1]].lease_token or ""), None, now=T0 + 1)
        parent = list(statements)
    finally:
        conn.set_trace_callback(None)
    assert len(ordinary) == 3, ordinary  # BEGIN IMMEDIATE, the ack, COMMIT
    assert ordinary[0] == "BEGIN IMMEDIATE" and ordinary[-1] == "COMMIT"
    assert len(parent) > len(ordinary)  # a parent settles its child in the same transaction


def test_a_chain_longer_than_any_recursion_limit_cancels_to_its_end(
        backend: SqliteBackend) -> None:
    n = 2_500
    res = backend.enqueue_many([new_job()] + [new_job(after_refs=(i,)) for i in range(n)],
                               now=T0)
    [head] = backend.claim("default", 1, worker_id="w", lease_s=30, now=T0)
    backend.kill(Lease(head.id, head.lease_token or ""), ErrorInfo("rejected", "no"), now=T0)
    waiting = backend.list_jobs(state=JobState.WAITING, limit=10)
    assert waiting.jobs == []
    last = backend.get(res[-1].id)
    assert last is not None and last.state is JobState.CANCELLED
    assert last.errors[-1]["kind"] == "parent_failed"


def test_prune_takes_a_workflow_with_its_edges_and_batch(backend: SqliteBackend) -> None:
    jobs = [new_job(batch_id="b"), new_job(batch_id="b"),
            new_job(callback_of="b", after_refs=(0, 1), on_parent_failure="run")]
    ids = [r.id for r in backend.enqueue_many(jobs, now=T0, batches=[NewBatch("b")])]
    for _ in range(2):  # the members, then the callback they release
        claimed = backend.claim("default", 5, worker_id="w", lease_s=30, now=T0)
        backend.ack_many([(Lease(j.id, j.lease_token or ""), None) for j in claimed], now=T0)
    assert {backend.get(i).state for i in ids} == {JobState.SUCCEEDED}  # type: ignore[union-attr]
    assert backend.prune(older_than=1.0, now=T0 + 100) == 3
    conn = backend._conn()
    for table in ("conveyor_job_deps", "conveyor_batch_jobs", "conveyor_batches"):
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0, table


def test_a_child_cancelled_by_the_cascade_wakes_its_waiter(backend: SqliteBackend) -> None:
    parent = backend.enqueue_many([new_job()], now=T0)[0].id
    child = backend.enqueue_many([new_job(after=(parent,))], now=T0)[0].id
    [job] = backend.claim("default", 1, worker_id="w", lease_s=30, now=T0)
    kill = threading.Timer(0.1, lambda: backend.kill(
        Lease(parent, job.lease_token or ""), ErrorInfo("rejected", "no"), now=T0))
    with backend.finish_watch(child) as sleep:
        kill.start()
        start = time.monotonic()
        sleep(10.0)  # only a wake-up naming the child ends this before its 10 s
        woke_after = time.monotonic() - start
    kill.join()
    assert woke_after < 5.0
    assert backend.get(child).state is JobState.CANCELLED  # type: ignore[union-attr]
