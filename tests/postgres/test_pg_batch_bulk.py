"""A workflow write on PostgreSQL puts the jobs that need no decision of their own (batch
members without parents, unique key, fair key or depth limit) in one statement per run of them,
as a plain enqueue_many does, and keeps one insert each for the others (children, callbacks).

The statements are counted on the caller's connection (``enqueue_many(connection=...)``): its
cursors count every statement they send."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from stores import postgres_store
from support import T0, new_job

from conveyor import JobState
from conveyor.backends.base import Lease, NewBatch
from conveyor.backends.postgres import PostgresBackend

MEMBERS = 1000


class CountingCursor(psycopg.Cursor[Any]):
    """Counts the statements it sends: an executemany sends one per parameter set."""

    sent = 0

    def execute(self, query: Any, params: Any = None, **kw: Any) -> Any:
        CountingCursor.sent += 1
        return super().execute(query, params, **kw)

    def executemany(self, query: Any, params_seq: Any, **kw: Any) -> None:
        params_seq = list(params_seq)
        CountingCursor.sent += len(params_seq)
        super().executemany(query, params_seq, **kw)


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    with postgres_store(tmp_path) as url:
        yield url


@pytest.fixture
def backend(url: str) -> Iterator[PostgresBackend]:
    b = PostgresBackend(url)
    try:
        yield b
    finally:
        b.close()


def job_rows(url: str, ids: list[int]) -> dict[int, dict[str, Any]]:
    with psycopg.connect(url) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        rows = cur.execute("SELECT id, state, has_children, batch_id, callback_of, parents,"
                           " parents_left FROM conveyor_jobs WHERE id = ANY(%s)", [ids]).fetchall()
    return {r["id"]: r for r in rows}


def test_a_batch_of_a_thousand_members_and_its_callbacks_takes_a_few_statements(
    url: str, backend: PostgresBackend
) -> None:
    members = [new_job(args={"i": i}, batch_id="b1") for i in range(MEMBERS)]
    refs = tuple(range(MEMBERS))
    callbacks = [new_job(task="t.done", after_refs=refs, callback_of="b1"),
                 new_job(task="t.after", after_refs=refs, callback_of="b1",
                         on_parent_failure="run")]
    CountingCursor.sent = 0
    with psycopg.connect(url, cursor_factory=CountingCursor) as conn:
        results = backend.enqueue_many([*members, *callbacks], now=T0, connection=conn,
                                       batches=[NewBatch("b1")])
        conn.commit()
    # BEGIN, the batch record, the members in one statement, one insert per callback, the
    # wake-up.
    assert CountingCursor.sent <= 6, f"{CountingCursor.sent} statements for one batch write"

    ids = [r.id for r in results]
    assert all(r.created for r in results)
    assert ids == sorted(ids) and len(set(ids)) == len(ids)  # in call order
    member_ids = ids[:MEMBERS]
    rows = job_rows(url, ids)
    for i, job_id in enumerate(member_ids):
        row = rows[job_id]
        assert (row["state"], row["has_children"], row["batch_id"]) == ("available", True, "b1")
        job = backend.get(job_id)
        assert job is not None and job.args == {"i": i}
    for job_id in ids[MEMBERS:]:
        row = rows[job_id]
        assert (row["state"], row["callback_of"], row["parents_left"]) == ("waiting", "b1", MEMBERS)
        assert row["parents"] == member_ids
    info = backend.get_batch("b1")
    assert info is not None
    assert (info.total, info.pending, info.waiting) == (MEMBERS, MEMBERS, 0)
    assert (info.on_success, info.on_complete) == (ids[MEMBERS], ids[MEMBERS + 1])


def test_members_between_children_keep_call_order_and_their_references(
    url: str, backend: PostgresBackend
) -> None:
    """Runs of members split by jobs that need their own insert: every id comes back at its
    position, a reference names the job at the position it gives, only referenced jobs are
    marked as parents, and a member's finish releases its child."""
    jobs = [
        new_job(args={"n": 0}, batch_id="outer"),
        new_job(args={"n": 1}, batch_id="outer"),
        new_job(args={"n": 2}, batch_id="outer", after_refs=(0,)),  # a child: its own insert
        new_job(args={"n": 3}, batch_id="outer", delay=60.0),  # scheduled, another run
        new_job(args={"n": 4}, batch_id="inner", queue="other"),
        new_job(args={"n": 5}, batch_id="outer", unique_key="u5"),  # needs its own insert
        new_job(args={"n": 6}, batch_id="outer"),
        new_job(task="t.done", after_refs=(4,), callback_of="inner"),
        new_job(args={"n": 8}, after_refs=(1, 6)),
    ]
    results = backend.enqueue_many(jobs, now=T0,
                                   batches=[NewBatch("outer"), NewBatch("inner", "outer")])
    ids = [r.id for r in results]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    for i, job_id in enumerate(ids):
        job = backend.get(job_id)
        assert job is not None and job.task == jobs[i].task and job.args == json.loads(jobs[i].args)
    rows = job_rows(url, ids)
    assert [rows[i]["state"] for i in ids] == [
        "available", "available", "waiting", "scheduled", "available", "available", "available",
        "waiting", "waiting"]
    assert [rows[i]["has_children"] for i in ids] == [
        True, True, False, False, True, False, True, False, False]
    assert [rows[i]["batch_id"] for i in ids] == [
        "outer", "outer", "outer", "outer", "inner", "outer", "outer", None, None]
    assert rows[ids[2]]["parents"] == [ids[0]]
    assert rows[ids[7]]["parents"] == [ids[4]]
    assert rows[ids[8]]["parents"] == [ids[1], ids[6]]

    # The first member's finish releases the child that referenced it.
    claimed = {j.id: j for j in backend.claim("default", 10, worker_id="w", lease_s=30, now=T0)}
    first = claimed[ids[0]]
    backend.ack(Lease(first.id, first.lease_token or ""), json.dumps(1), now=T0)
    child = backend.get(ids[2])
    assert child is not None and child.state is JobState.AVAILABLE
