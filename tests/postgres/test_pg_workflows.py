"""Workflows on PostgreSQL, where the conformance file (tests/conformance/test_workflow_store.py)
does not reach: migration 010 on a store of the previous version, the settling trigger never
firing for an ordinary job's finish, a parent finished by a task's own transaction, and the
wake-up of a child's queue."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pgschema import fill
from stores import postgres_store
from support import T0, new_job

from conveyor import JobState
from conveyor.backends.base import ErrorInfo, Lease
from conveyor.backends.postgres import PostgresBackend, Q
from conveyor.backends.postgres import migrate as pg_migrate

TRIGGER = "conveyor_settle_children"


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


def enqueue(backend: PostgresBackend, **kw: Any) -> int:
    [res] = backend.enqueue_many([new_job(**kw)], now=T0)
    return res.id


def take(backend: PostgresBackend, queue: str = "default") -> Lease:
    [job] = backend.claim(queue, 1, worker_id="w", lease_s=30, now=T0)
    return Lease(job.id, job.lease_token or "")


def trigger_calls_of_ack(url: str, lease: Lease) -> int:
    """Runs the backend's own ack statement and counts the trigger's calls in its transaction."""
    with psycopg.connect(url) as conn:
        conn.execute("SET LOCAL track_functions = 'pl'")
        row = conn.execute(Q["ack"], {"id": lease.job_id, "token": lease.token, "now": T0,
                                      "result": json.dumps(1)}).fetchone()
        assert row is not None  # acked
        calls = conn.execute("SELECT calls FROM pg_stat_xact_user_functions WHERE funcname = %s",
                             [TRIGGER]).fetchone()
        conn.commit()
    return 0 if calls is None else int(calls[0])


def test_a_plain_ack_does_not_fire_the_trigger(url: str, backend: PostgresBackend) -> None:
    enqueue(backend)
    assert trigger_calls_of_ack(url, take(backend)) == 0
    parent = enqueue(backend)
    child = enqueue(backend, after=(parent,))
    assert trigger_calls_of_ack(url, take(backend)) == 1
    job = backend.get(child)
    assert job is not None and job.state is JobState.AVAILABLE


def test_migration_from_the_previous_version_keeps_the_jobs(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as m:
        m.setattr(pg_migrate, "MIGRATIONS", [x for x in pg_migrate.MIGRATIONS if x.version <= 9])
        pg_migrate.migrate(url)
    fill(url, 2_000, scheduled=10, running=10)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE conveyor_jobs SET state = 'available', result = NULL,"
                     " finished_at = NULL, queue = 'old' WHERE id = 1")
        before = conn.execute("SELECT relfilenode, (SELECT count(*) FROM conveyor_jobs)"
                              " FROM pg_class WHERE oid = 'conveyor_jobs'::regclass").fetchone()
    backend = PostgresBackend(url)
    try:
        assert backend.schema_version() == pg_migrate.LATEST
        with psycopg.connect(url, autocommit=True) as conn:
            after = conn.execute("SELECT relfilenode, (SELECT count(*) FROM conveyor_jobs)"
                                 " FROM pg_class WHERE oid = 'conveyor_jobs'::regclass").fetchone()
        assert after == before  # not rewritten, nothing lost
        old = backend.get(1)
        assert old is not None and old.parents == () and old.batch_id is None
        # A job from before the migration can be a parent.
        child = enqueue(backend, after=(1,))
        assert backend.get(child).state is JobState.WAITING  # type: ignore[union-attr]
        backend.ack(take(backend, "old"), None, now=T0)
        assert backend.get(child).state is JobState.AVAILABLE  # type: ignore[union-attr]
    finally:
        backend.close()


@pytest.mark.parametrize("commit", [True, False])
def test_a_parent_completed_in_a_transaction_releases_its_child_at_commit(
    backend: PostgresBackend, commit: bool
) -> None:
    parent = enqueue(backend)
    child = enqueue(backend, after=(parent,))
    lease = take(backend)
    with backend.completion_connection() as conn:
        backend.ack(lease, json.dumps("done"), now=T0, connection=conn)
        seen_inside = backend.get(child, connection=conn)
        assert seen_inside is not None and seen_inside.state is JobState.AVAILABLE
        if commit:
            conn.commit()
    job = backend.get(child)
    assert job is not None
    assert job.state is (JobState.AVAILABLE if commit else JobState.WAITING)


def test_a_released_child_wakes_its_queue(url: str, backend: PostgresBackend) -> None:
    parent = enqueue(backend)
    enqueue(backend, after=(parent,), queue="kids")
    lease = take(backend)
    with psycopg.connect(url, autocommit=True) as listener:
        listener.execute("LISTEN conveyor_wake")
        backend.ack(lease, None, now=T0)
        got = [n.payload for n in listener.notifies(timeout=2.0, stop_after=1)]
    assert got == ["kids"]


def test_a_cascade_wakes_a_waiter_of_a_cancelled_descendant(
    url: str, backend: PostgresBackend
) -> None:
    res = backend.enqueue_many([new_job(), new_job(after_refs=(0,)), new_job(after_refs=(1,))],
                               now=T0)
    grandchild = res[2].id
    with psycopg.connect(url, autocommit=True) as listener:
        listener.execute("LISTEN conveyor_done")
        listener.execute(Q["mark_waited"], {"id": grandchild})
        assert backend.cancel(res[0].id, now=T0)
        got = [n.payload for n in listener.notifies(timeout=2.0, stop_after=1)]
    assert got == [str(grandchild)]


def test_a_finish_that_waited_on_a_childs_enqueue_sees_the_child(
    url: str, backend: PostgresBackend
) -> None:
    """The stranding order made certain: the child's enqueue (in a caller's transaction) holds
    the parent's row lock while the parent's ack waits for it; the ack's trigger then reads the
    child, which committed after the ack's statement began."""
    import threading
    import time

    parent = enqueue(backend)
    lease = take(backend)
    with psycopg.connect(url) as conn:
        [res] = backend.enqueue_many([new_job(after=(parent,), queue="kids")], now=T0,
                                     connection=conn)
        acked = threading.Event()
        t = threading.Thread(target=lambda: (backend.ack(lease, None, now=T0), acked.set()))
        t.start()
        time.sleep(0.5)
        assert not acked.is_set()  # waiting for the enqueue's lock on the parent
        conn.commit()
        t.join(10)
    assert acked.is_set()
    job = backend.get(res.id)
    assert job is not None and job.state is JobState.AVAILABLE



def test_purge_takes_the_edges_of_what_it_deletes(url: str, backend: PostgresBackend) -> None:
    """Edges have no foreign keys (no trigger on ordinary deletes): purge deletes them itself."""
    parent = enqueue(backend)
    child = enqueue(backend, after=(parent,), on_parent_failure="run")
    lease = take(backend)
    backend.kill(lease, ErrorInfo("rejected", "made dead for the test"), now=T0)
    assert backend.purge(job_ids=[parent]) == 1
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM conveyor_edges WHERE parent_id = %s",
                           [parent]).fetchone()
    assert row is not None and row[0] == 0
    assert backend.get(child) is not None
