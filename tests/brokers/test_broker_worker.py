"""A real Worker on a broker: jobs that succeed, retry and go dead, as a user runs them. A
broker keeps no results, so outcomes are read from what the tasks did and from the dead
lane."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
from brokerkit import Broker, wait_for
from support import running_worker

from conveyor import Conveyor, JobState, Reject, RetryPolicy, Unsupported
from conveyor.worker import Worker


@pytest.fixture
def app(broker: Broker) -> Iterator[Conveyor]:
    app = Conveyor(broker.url, retry=RetryPolicy(base=0.01, cap=0.05))
    try:
        yield app
    finally:
        app.close()


def test_a_worker_runs_retries_and_buries(app: Conveyor) -> None:
    done: list[int] = []
    tries: dict[int, int] = {}
    lock = threading.Lock()

    @app.task(name="add")
    def add(a: int, b: int) -> int:
        with lock:
            done.append(a + b)
        return a + b

    @app.task(name="flaky", max_attempts=3)
    def flaky(n: int) -> str:
        with lock:
            tries[n] = tries.get(n, 0) + 1
            if tries[n] < 2:
                raise ValueError(f"not yet {n}")
        return "ok"

    @app.task(name="broken", max_attempts=2)
    def broken() -> None:
        raise RuntimeError("always")

    @app.task(name="refused")
    def refused() -> None:
        raise Reject("bad input")

    with running_worker(app, concurrency=4):
        for i in range(30):
            add.enqueue(i, 1)
        flaky.enqueue(1)
        broken.enqueue()
        refused.enqueue()
        wait_for(lambda: len(done) == 30 and tries.get(1) == 2)
        dead = wait_for(lambda: len(app.backend.list_jobs(state=JobState.DEAD,
                                                          queue="default").jobs) == 2
                        and app.backend.list_jobs(state=JobState.DEAD, queue="default").jobs)
    assert sorted(done) == list(range(1, 31))
    by_task = {j.task: j for j in dead}  # type: ignore[attr-defined]
    assert [e["kind"] for e in by_task["broken"].errors] == ["exception", "exception"]
    assert by_task["broken"].attempts == 2
    assert [e["kind"] for e in by_task["refused"].errors] == ["rejected"]
    assert app.backend.stats().queues[0].available == 0


def test_a_worker_with_cron_schedules_is_refused(app: Conveyor) -> None:
    @app.task(name="tick")
    def tick() -> None:
        pass

    app.cron("* * * * *", name="every-minute")(tick)
    with pytest.raises(Unsupported, match="keep cron ticks"):
        Worker(app, concurrency=1)


def test_a_worker_prunes_without_failing_on_the_history(
        app: Conveyor, caplog: pytest.LogCaptureFixture) -> None:
    """A broker keeps no history: the worker's retention passes leave it alone (they logged
    "pruning failed" with a traceback every pass)."""
    passes: list[int] = []
    prune = app.backend.prune

    def counted(**kw: object) -> int:
        passes.append(1)
        return prune(**kw)  # type: ignore[arg-type]

    app.backend.prune = counted  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="conveyor"), \
            running_worker(app, concurrency=1, prune_interval=0.1, maintenance_interval=0.05):
        wait_for(lambda: len(passes) >= 3)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
