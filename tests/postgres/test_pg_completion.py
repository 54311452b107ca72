"""A task that completes its own job through ``current_job().transaction()`` on PostgreSQL:
what the worker does after that commit (no heartbeat of the finished job, no "lease lost"),
and connections enough for every slot to hold such a transaction at once."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from pgrig import fresh_schema
from support import WorkerThread, wait_for_job, wait_until

from conveyor import Conveyor, JobState, current_job


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

