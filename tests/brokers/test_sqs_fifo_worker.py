"""A real Worker on a Conveyor app on SQS FIFO queues (``sqs://...&fifo=true``, moto's server),
end to end: tenants' jobs in order, a unique key enqueued twice runs once, a delayed job and a
retry's backoff without per-message DelaySeconds, a failing job dead.

Conditions are awaited by polling with a deadline, never by fixed sleeps."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from support import running_worker, wait_until

from conveyor import Conveyor, JobState, Retry, RetryPolicy
from conveyor.executor import current_job


@pytest.fixture
def app(sqs_url: str) -> Iterator[Conveyor]:
    app = Conveyor(f"{sqs_url}&fifo=true", visibility_timeout=5,
                   retry=RetryPolicy(base=0.01, cap=0.05))
    try:
        yield app
    finally:
        app.close()


def test_a_worker_runs_fifo_jobs(app: Conveyor) -> None:
    seen: list[tuple[str, int, int]] = []
    lock = threading.Lock()

    def saw(name: str, n: int) -> int:
        ctx = current_job()
        assert ctx is not None
        with lock:
            seen.append((name, n, ctx.attempt))
        return ctx.attempt

    @app.task(name="step", max_attempts=3)
    def step(tenant: str, n: int) -> None:
        if saw(tenant, n) == 1 and (tenant, n) == ("a", 1):
            raise Retry(delay=0.5, reason="not yet")

    @app.task(name="once")
    def once(n: int) -> None:
        saw("once", n)

    @app.task(name="bad", max_attempts=2)
    def bad() -> None:
        saw("bad", 0)
        raise ValueError("always")

    for n in range(4):
        step.options(fair_key="a").enqueue("a", n)
        step.options(fair_key="b").enqueue("b", n)
    first = once.options(unique_key="nightly").enqueue(1)
    second = once.options(unique_key="nightly").enqueue(2)  # dropped by SQS
    assert first.id != second.id  # SQS does not say which job holds the key
    once.options(delay=1).enqueue(3)
    dead_job = bad.enqueue()

    def dead() -> list[int]:
        page = app.backend.list_jobs(state=JobState.DEAD, queue="default")
        return [j.id for j in page.jobs]

    # One slot: jobs start one at a time, in the order the queue hands them out.
    with running_worker(app, concurrency=1) as wt:
        worker = wt.worker
        wait_until(lambda: worker.counters.succeeded == 10 and worker.counters.dead == 1,
                   timeout=60, message="every job finished")
        assert wait_until(dead, timeout=10) == [dead_job.id]

    with lock:
        runs = list(seen)
    for tenant in ("a", "b"):
        firsts = [n for name, n, attempt in runs if name == tenant and attempt == 1]
        assert firsts == [0, 1, 2, 3]  # each tenant's jobs in the order enqueued
    assert ("a", 1, 2) in runs  # the retry ran after its backoff
    assert sorted(n for name, n, _ in runs if name == "once") == [1, 3]
    assert [a for name, _, a in runs if name == "bad"] == [1, 2]
    counters = worker.counters
    assert (counters.succeeded, counters.retried, counters.dead, counters.lease_lost) == (
        10, 2, 1, 0)
    [stats] = app.backend.stats().queues
    assert (stats.available, stats.scheduled, stats.running, stats.dead) == (0, 0, 0, 1)
