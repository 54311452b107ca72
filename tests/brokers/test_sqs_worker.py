"""A real Worker on a Conveyor app on sqs:// (moto's server), end to end: jobs that succeed, retry,
fail until dead and are rejected. A broker keeps no job table (app.get_job is Unsupported), so
outcomes are read from what the tasks saw, the worker's counters and the dead listing.

Conditions are awaited by polling with a deadline, never by fixed sleeps."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator

import pytest
from support import running_worker, wait_until

from conveyor import Conveyor, JobState, Reject, Retry, RetryPolicy, Unsupported
from conveyor.executor import current_job


@pytest.fixture
def app(sqs_url: str) -> Iterator[Conveyor]:
    app = Conveyor(sqs_url, visibility_timeout=5, retry=RetryPolicy(base=0.01, cap=0.05))
    try:
        yield app
    finally:
        app.close()


def test_a_worker_runs_jobs_on_sqs(app: Conveyor, caplog: pytest.LogCaptureFixture) -> None:
    seen: list[tuple[str, int]] = []
    lock = threading.Lock()

    def saw(name: str) -> int:
        ctx = current_job()
        assert ctx is not None
        with lock:
            seen.append((name, ctx.attempt))
        return ctx.attempt

    @app.task(name="ok")
    def ok(n: int) -> int:
        saw(f"ok{n}")
        return n

    @app.task(name="aok")
    async def aok() -> None:
        await asyncio.sleep(0)
        saw("aok")

    @app.task(name="flaky", max_attempts=3)
    def flaky() -> str:
        if saw("flaky") == 1:
            raise Retry(delay=0.5, reason="not yet")
        return "done"

    @app.task(name="bad", max_attempts=2)
    def bad() -> None:
        saw("bad")
        raise ValueError("always")

    @app.task(name="no")
    def no() -> None:
        saw("no")
        raise Reject("not this one")

    caplog.set_level(logging.INFO, logger="conveyor")
    jobs = [ok.enqueue(1), ok.enqueue(2), aok.enqueue(), flaky.enqueue(), bad.enqueue(),
            no.enqueue()]
    with pytest.raises(Unsupported):
        app.get_job(jobs[0].id)
    dead_ids = {jobs[4].id, jobs[5].id}

    def dead() -> dict[int, list[dict[str, object]]]:
        page = app.backend.list_jobs(state=JobState.DEAD, queue="default")
        found = {j.id: j.errors for j in page.jobs}
        return found if set(found) == dead_ids else {}

    # Retention passes often (the default is a minute): a broker has no history to roll up.
    with running_worker(app, prune_interval=0.2) as wt:
        worker = wt.worker
        wait_until(lambda: worker.counters.succeeded == 4 and worker.counters.dead == 2,
                   timeout=30, message="every job finished")
        errors = wait_until(dead, timeout=10, message="both failed jobs in the dead lane")
        assert worker.flush_history() == 0  # a broker keeps no history: nothing to write

    with lock:
        assert sorted(seen) == sorted([("ok1", 1), ("ok2", 1), ("aok", 1), ("flaky", 1),
                                       ("flaky", 2), ("bad", 1), ("bad", 2), ("no", 1)])
    counters = worker.counters
    assert (counters.succeeded, counters.retried, counters.dead, counters.lease_lost) == (4, 2, 2, 0)
    assert [(e["attempt"], e["kind"], e["message"]) for e in errors[jobs[4].id]] == [
        (1, "exception", "always"), (2, "exception", "always")]
    assert [(e["attempt"], e["kind"]) for e in errors[jobs[5].id]] == [(1, "rejected")]
    [stats] = app.backend.stats().queues
    assert (stats.available, stats.scheduled, stats.running, stats.dead) == (0, 0, 0, 2)
    # Nothing the worker asked of the store failed (history, retention, leases).
    complaints = [r.getMessage() for r in caplog.records
                  if r.exc_info is not None
                  or (r.levelno >= logging.WARNING and r.name != "conveyor.worker")
                  or any(w in r.getMessage() for w in ("history", "lease lost", "pruning"))]
    assert complaints == []
