"""A task that completes its own job through ``current_job().transaction()`` on PostgreSQL:
what the worker does after that commit (no heartbeat of the finished job, no "lease lost"),
and connections enough for every slot to hold such a transaction at once."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from pgrig import fresh_schema, with_params
from support import WorkerThread, running_worker, wait_for_job, wait_until

from conveyor import Conveyor, JobState, current_job
from conveyor.backends.postgres import PostgresBackend
from conveyor.errors import ConfigurationError, StoreUnavailable


@pytest.fixture
def pg_url() -> Iterator[str]:
    with fresh_schema() as url:  # skips locally, fails in CI, if PostgreSQL is unreachable
        yield url


class Beats:
    """Counts the worker's heartbeat calls that returned (wraps the backend's method)."""

    def __init__(self, app: Conveyor) -> None:
        self.count = 0
        self._real = app.backend.heartbeat
        app.backend.heartbeat = self._beat  # type: ignore[method-assign]

    def _beat(self, *args: Any, **kwargs: Any) -> set[int]:
        try:
            return self._real(*args, **kwargs)
        finally:
            self.count += 1

    def wait_past(self, seen: int, n: int = 2) -> None:
        wait_until(lambda: self.count >= seen + n, timeout=30, message=f"{n} heartbeats after {seen}")


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_job_completed_in_its_transaction_leaves_the_heartbeat_set(
    pg_url: str, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = Conveyor(pg_url, visibility_timeout=0.6)
    try:
        beats = Beats(app)
        seen: dict[str, Any] = {}

        def complete_then_linger() -> None:
            ctx = current_job()
            assert ctx is not None
            with ctx.transaction(result="done") as conn:
                conn.execute("SELECT 1")
            # Committed: the job is succeeded. Run on past two heartbeats, each of which
            # refused this finished job's lease before.
            beats.wait_past(beats.count)
            seen["cancelled"] = ctx.cancelled

        if kind == "sync":
            @app.task(name="finish")
            def finish() -> None:
                complete_then_linger()
        else:
            @app.task(name="finish")
            async def finish() -> None:  # type: ignore[misc]
                await asyncio.to_thread(complete_then_linger)

        caplog.set_level(logging.DEBUG, logger="conveyor")
        job = finish.enqueue()
        wt = WorkerThread(app, concurrency=2).start()
        try:
            done = wait_for_job(app, job.id, timeout=30)
            wait_until(lambda: wt.worker.counters.succeeded + wt.worker.counters.lease_lost >= 1 and "cancelled" in seen,
                       timeout=30, message="the worker settled the job")
        finally:
            wt.stop()
            wt.join()
        assert done.state is JobState.SUCCEEDED and done.result == "done" and done.attempts == 1
        assert seen["cancelled"] is False
        assert wt.worker.counters.succeeded == 1
        assert wt.worker.counters.lease_lost == 0
        assert not [r for r in caplog.records if "lease lost" in r.getMessage() or "lease was lost" in r.getMessage()]
    finally:
        app.close()


SLOTS = 14  # above the pool's old fixed size of 10


def test_every_slot_can_hold_a_transaction_at_once(pg_url: str) -> None:
    """Each of SLOTS tasks holds its transaction() open until all of them hold one (a barrier):
    the pool must have a connection for every slot, and room left for the worker's own calls."""
    app = Conveyor(pg_url, visibility_timeout=30)
    try:
        barrier = threading.Barrier(SLOTS, timeout=60)

        @app.task(name="hold", max_attempts=1)
        def hold(n: int) -> int:
            ctx = current_job()
            assert ctx is not None
            with ctx.transaction(result=n) as conn:
                conn.execute("SELECT 1")
                barrier.wait()
                job = app.get_job(ctx.id)  # the app's own calls still find a connection
                assert job.state is JobState.RUNNING
            return n

        jobs = [hold.enqueue(n) for n in range(SLOTS)]
        wt = WorkerThread(app, concurrency=SLOTS).start()
        try:
            done = [wait_for_job(app, j.id, timeout=90) for j in jobs]
        finally:
            wt.stop()
            wt.join()
        assert [(j.state, j.result, j.attempts) for j in done] == [(JobState.SUCCEEDED, n, 1) for n in range(SLOTS)]
    finally:
        app.close()


def test_a_fixed_pool_size_is_kept_and_its_exhaustion_names_the_setting(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``?pool_max_size=`` (or ``Conveyor(pool_size=)``) fixes the size: a worker does not grow
    it, warns when it is not above its slots, and a task that finds no connection is told which
    setting to raise."""
    app = Conveyor(with_params(pg_url, pool_max_size="1"), visibility_timeout=30)
    try:
        backend = app.backend
        assert isinstance(backend, PostgresBackend)
        assert backend.reserve_connections(2) != []  # warned: 1 connection for 2 slots
        with backend.completion_connection(), pytest.raises(StoreUnavailable) as err:
            app.get_job(1)
        assert "pool_max_size=N" in str(err.value) and "pool_size=N" in str(err.value)
        backend.reserve_connections(-2)
    finally:
        app.close()
    with pytest.raises(ConfigurationError):
        Conveyor(pg_url, pool_size=0)
    app = Conveyor(pg_url, pool_size=3)
    try:
        caplog.set_level(logging.WARNING, logger="conveyor")
        with running_worker(app, concurrency=4) as wt:
            wait_until(lambda: wt.worker._started.is_set(), timeout=30, message="worker started")
            assert app.backend._pool.max_size == 3  # type: ignore[attr-defined]
        assert any("pool_max_size=3" in r.getMessage() for r in caplog.records)
    finally:
        app.close()


def test_the_default_pool_follows_the_workers_concurrency(pg_url: str) -> None:
    app = Conveyor(pg_url)
    try:
        pool, control = app.backend._pool, app.backend._control  # type: ignore[attr-defined]
        alone, own = pool.max_size, control.max_size
        with running_worker(app, concurrency=20) as one, running_worker(app, concurrency=5) as two:
            wait_until(lambda: one.worker._started.is_set() and two.worker._started.is_set(), timeout=30,
                       message="workers started")
            assert pool.max_size == alone + 25
            assert control.max_size == 2 * own  # each worker's heartbeats and claims have their share
        assert (pool.max_size, control.max_size) == (alone, own)
    finally:
        app.close()
