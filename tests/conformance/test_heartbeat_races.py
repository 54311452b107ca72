"""A heartbeat that meets a job whose outcome (a success, a retry) is already stored: the job is
done, not lost."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from support import running_worker, wait_for_job, wait_until

from conveyor import Conveyor, JobState, Retry


@pytest.mark.needs("lookup")
def test_a_heartbeat_refused_because_the_ack_landed_is_not_a_lost_lease(
    make_app: Callable[..., Conveyor], caplog: pytest.LogCaptureFixture
) -> None:
    """The ack of a finished job is written; before the worker takes in the ack's reply, its
    next heartbeats still carry the job and the store refuses them (the job is succeeded).
    The reply is held back here until two heartbeats have come back, so that always happens.
    The ack's answer decides: the job counts as succeeded, never as a lost lease."""
    app = make_app(visibility_timeout=0.6)

    @app.task(name="quick")
    def quick(n: int) -> int:
        return n

    beats = {"n": 0}
    real_heartbeat = app.backend.heartbeat

    def heartbeat(*args: Any, **kwargs: Any) -> set[int]:
        try:
            return real_heartbeat(*args, **kwargs)
        finally:
            beats["n"] += 1

    app.backend.heartbeat = heartbeat  # type: ignore[method-assign]
    caplog.set_level(logging.DEBUG, logger="conveyor")
    with running_worker(app, concurrency=2) as wt:
        worker = wt.worker
        real_acked_all = worker.completer.acks_done

        def acked_all(batch: Sequence[Any], held: Sequence[bool]) -> None:
            seen = beats["n"]

            async def later() -> None:
                while beats["n"] < seen + 2:
                    await asyncio.sleep(0.01)
                real_acked_all(batch, held)

            asyncio.get_running_loop().create_task(later())

        worker.completer.acks_done = acked_all  # type: ignore[method-assign]
        jobs = [quick.enqueue(n) for n in range(3)]
        done = [wait_for_job(app, j.id, timeout=30) for j in jobs]
        wait_until(lambda: worker.counters.succeeded + worker.counters.lease_lost >= 3, timeout=30,
                   message="the worker took in every ack")
    assert [(j.state, j.attempts) for j in done] == [(JobState.SUCCEEDED, 1)] * 3
    assert worker.counters.succeeded == 3 and worker.counters.lease_lost == 0
    assert not [r for r in caplog.records if "lease lost" in r.getMessage() or "lease was lost" in r.getMessage()]


@pytest.mark.needs("lookup")
def test_a_heartbeat_refused_because_the_retry_landed_is_not_a_lost_lease(
    make_app: Callable[..., Conveyor], caplog: pytest.LogCaptureFixture
) -> None:
    """The same for a retry: it is written, and before the worker takes in its answer the next
    heartbeats still carry the job, which the store refuses (the job is scheduled again). The
    retry's answer is held back here until two heartbeats have come back. The retry's answer
    decides (LeaseLost if the lease was lost): the job counts as retried, never as a lost lease.
    A broker store (SQS) writes a retry in several round trips, so there it happens often."""
    app = make_app(visibility_timeout=0.6)

    @app.task(name="again", max_attempts=3)
    def again() -> None:
        raise Retry(delay=60, reason="later")

    beats = {"n": 0}
    real_heartbeat = app.backend.heartbeat
    real_retry = app.backend.retry

    def heartbeat(*args: Any, **kwargs: Any) -> set[int]:
        try:
            return real_heartbeat(*args, **kwargs)
        finally:
            beats["n"] += 1

    def retry(*args: Any, **kwargs: Any) -> JobState:
        state = real_retry(*args, **kwargs)
        seen = beats["n"]
        wait_until(lambda: beats["n"] >= seen + 2, timeout=30, message="two more heartbeats")
        return state

    app.backend.heartbeat = heartbeat  # type: ignore[method-assign]
    app.backend.retry = retry  # type: ignore[method-assign]
    caplog.set_level(logging.DEBUG, logger="conveyor")
    with running_worker(app, concurrency=2) as wt:
        worker = wt.worker
        job = again.enqueue()
        wait_until(lambda: worker.counters.retried >= 1, timeout=30,
                   message="the worker took in the retry's answer")
        assert wait_for_job(app, job.id, "scheduled").attempts == 1
    assert worker.counters.retried == 1 and worker.counters.lease_lost == 0
    assert not [r for r in caplog.records if "lease lost" in r.getMessage()]
