"""PostgreSQL-only guarantees: enqueue inside the caller's transaction, and a task whose own
writes commit in the same transaction as its job's success (exactly-once database effects)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from pgrig import fresh_schema
from support import running_worker, wait_for_job

from conveyor import Conveyor, JobState, LeaseLost, current_job
from conveyor.backends.base import Lease
from conveyor.errors import ConfigurationError


@pytest.fixture
def pg_url() -> Iterator[str]:
    with fresh_schema() as url:  # skips locally, fails in CI, if PostgreSQL is unreachable
        yield url


@pytest.fixture
def app(pg_url: str) -> Iterator[Conveyor]:
    a = Conveyor(pg_url, visibility_timeout=5)
    yield a
    a.close()


def _count_jobs(app: Conveyor) -> int:
    return sum(q.scheduled + q.available + q.running + q.succeeded + q.dead + q.cancelled
               for q in app.backend.stats().queues)


def test_rolled_back_enqueue_leaves_no_job(app: Conveyor, pg_url: str) -> None:
    @app.task
    def ping(n: int) -> int:
        return n

    assert app.backend.schema_version() >= 1  # migrate first, outside the caller's transaction
    with psycopg.connect(pg_url) as conn:
        job = ping.enqueue(1, connection=conn)
        assert job.id > 0
        # Not visible to anyone else before commit.
        assert app.backend.get(job.id) is None
        conn.rollback()
    assert app.backend.get(job.id) is None
    assert _count_jobs(app) == 0


def test_committed_enqueue_runs_exactly_once(app: Conveyor, pg_url: str) -> None:
    runs: list[int] = []

    @app.task
    def ping(n: int) -> int:
        runs.append(n)
        return n

    assert app.backend.schema_version() >= 1
    with psycopg.connect(pg_url) as conn:
        conn.execute("CREATE TABLE orders (id int primary key)")
        conn.execute("INSERT INTO orders VALUES (7)")
        job = ping.options(connection=conn).enqueue(7)
        conn.commit()
    with running_worker(app, concurrency=2):
        done = wait_for_job(app, job.id)
    assert done.state is JobState.SUCCEEDED and done.result == 7
    assert runs == [7]


def test_enqueue_many_and_unique_key_inside_a_transaction(app: Conveyor, pg_url: str) -> None:
    @app.task
    def ping(n: int) -> int:
        return n

    assert app.backend.schema_version() >= 1
    with psycopg.connect(pg_url) as conn:
        jobs = ping.options(connection=conn).enqueue_many([(1,), (2,), {"n": 3}])
        first = ping.options(connection=conn, unique_key="k").enqueue(4)
        again = ping.options(connection=conn, unique_key="k").enqueue(5)
        assert again.id == first.id  # found inside the same, uncommitted transaction
        conn.commit()
    assert [app.get_job(j.id).args for j in jobs] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert _count_jobs(app) == 4


def test_async_enqueue_on_an_async_connection(app: Conveyor, pg_url: str) -> None:
    @app.task
    def ping(n: int) -> int:
        return n

    assert app.backend.schema_version() >= 1

    async def scenario() -> tuple[int, int]:
        async with await psycopg.AsyncConnection.connect(pg_url) as conn:
            kept = await ping.aenqueue(1, connection=conn)
            await conn.commit()
            dropped = await ping.aenqueue(2, connection=conn)
            await conn.rollback()
            return kept.id, dropped.id

    kept, dropped = asyncio.run(scenario())
    assert app.get_job(kept).state is JobState.AVAILABLE
    assert app.backend.get(dropped) is None


def test_transactional_enqueue_needs_postgres(tmp_path: Path) -> None:
    app = Conveyor(f"sqlite:///{tmp_path}/x.db")

    @app.task
    def ping(n: int) -> int:
        return n

    with pytest.raises(ConfigurationError, match="PostgreSQL"):
        ping.enqueue(1, connection=object())
    assert app.backend.list_jobs().jobs == []
    app.close()


def test_transactional_completion_commits_writes_with_the_ack(app: Conveyor, pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("CREATE TABLE payments (order_id int primary key, amount int)")

    @app.task
    def charge(order_id: int) -> str:
        ctx = current_job()
        assert ctx is not None
        with ctx.transaction(result="charged") as conn:
            conn.execute("INSERT INTO payments VALUES (%s, %s)", (order_id, 100))
        return "ignored: the transaction already completed the job"

    job = charge.enqueue(1)
    with running_worker(app, concurrency=1):
        done = wait_for_job(app, job.id)
    assert done.state is JobState.SUCCEEDED
    assert done.result == "charged"
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM payments").fetchone() == (1,)


def test_transactional_completion_refuses_a_result_over_the_limit(pg_url: str) -> None:
    app = Conveyor(pg_url, visibility_timeout=5, max_result_bytes=100)
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("CREATE TABLE payments (order_id int primary key, amount int)")

    @app.task(max_attempts=3)
    def charge(order_id: int) -> None:
        ctx = current_job()
        assert ctx is not None
        with ctx.transaction(result="x" * 200) as conn:
            conn.execute("INSERT INTO payments VALUES (%s, %s)", (order_id, 100))

    try:
        job = charge.enqueue(1)
        with running_worker(app, concurrency=1):
            done = wait_for_job(app, job.id)
        assert done.state is JobState.DEAD and done.attempts == 1 and done.result is None
        assert [e["kind"] for e in done.errors] == ["result_too_large"]
        with psycopg.connect(pg_url) as conn:  # refused before the block ran: nothing written
            assert conn.execute("SELECT count(*) FROM payments").fetchone() == (0,)
    finally:
        app.close()


def test_transactional_completion_rolls_back_on_error(app: Conveyor, pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("CREATE TABLE payments (order_id int primary key, amount int)")

    @app.task(max_attempts=1)
    def charge(order_id: int) -> None:
        ctx = current_job()
        assert ctx is not None
        with ctx.transaction() as conn:
            conn.execute("INSERT INTO payments VALUES (%s, %s)", (order_id, 100))
            raise RuntimeError("card declined")

    job = charge.enqueue(1)
    with running_worker(app, concurrency=1):
        done = wait_for_job(app, job.id)
    assert done.state is JobState.DEAD
    assert done.errors[-1]["message"] == "card declined"
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM payments").fetchone() == (0,)


def test_a_lost_lease_rolls_back_the_tasks_writes(app: Conveyor, pg_url: str) -> None:
    """The zombie case: the lease is gone when the task commits, so its writes never land."""
    from conveyor.executor import JobContext

    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("CREATE TABLE payments (order_id int primary key)")

    @app.task
    def charge(order_id: int) -> None: ...

    job = charge.enqueue(1)
    backend = app.backend
    [claimed] = backend.claim("default", 1, worker_id="zombie", lease_s=30)
    now = backend.now()
    backend.reap(now=now + 60)  # the lease expired: another worker may take the job
    [again] = backend.claim("default", 1, worker_id="fresh", lease_s=30)
    assert again.attempts == 2

    ctx = JobContext(claimed, backend)
    with pytest.raises(LeaseLost), ctx.transaction() as conn:
        conn.execute("INSERT INTO payments VALUES (1)")
    assert not ctx.completed
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM payments").fetchone() == (0,)
    # The new attempt still owns the job and completes it.
    backend.ack(Lease(again.id, again.lease_token or ""), '"ok"')
    assert app.get_job(job.id).result == "ok"


def test_transactional_completion_needs_postgres(tmp_path: Path) -> None:
    app = Conveyor(f"sqlite:///{tmp_path}/x.db")

    @app.task(max_attempts=1)
    def charge() -> None:
        ctx = current_job()
        assert ctx is not None
        with ctx.transaction():
            pass

    job = charge.enqueue()
    with running_worker(app, concurrency=1):
        done = wait_for_job(app, job.id)
    assert done.state is JobState.DEAD
    assert "PostgreSQL" in done.errors[-1]["message"]
    app.close()


def test_tasks_holding_connections_do_not_starve_heartbeats(app: Conveyor, pg_url: str) -> None:
    """Twelve tasks hold transaction() connections longer than the lease: the worker's
    heartbeats use a pool of their own, so no lease expires and every job commits once."""
    import time

    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("CREATE TABLE effects (job_id bigint primary key)")
    lease_app = Conveyor(pg_url, visibility_timeout=1.5)

    @lease_app.task(name="hold", timeout=30)
    def hold() -> None:
        ctx = current_job()
        assert ctx is not None
        with ctx.transaction() as conn:
            conn.execute("INSERT INTO effects VALUES (%s)", (ctx.id,))
            time.sleep(2.5)

    jobs = hold.enqueue_many([() for _ in range(12)])
    try:
        with running_worker(lease_app, concurrency=12):
            done = [wait_for_job(lease_app, j.id, timeout=60) for j in jobs]
    finally:
        lease_app.close()
    assert all(j.state is JobState.SUCCEEDED and j.attempts == 1 and j.errors == [] for j in done)
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM effects").fetchone() == (12,)
