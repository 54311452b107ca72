"""Worker(burst=True): stops by itself once its queues have no available or due job and its
own jobs have finished (RQ's ``--burst``), on each store."""

from __future__ import annotations

import threading
import time

import pytest

from conveyor import Conveyor, JobState
from conveyor.worker import Worker


def run_burst(app: Conveyor, timeout: float = 20, **kw: object) -> Worker:
    w = Worker(app, burst=True, install_signal_handlers=False, poll_interval=0.2,
               **kw)  # type: ignore[arg-type]
    done = threading.Event()

    def run() -> None:
        try:
            w.run()
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    if not done.wait(timeout):
        w.stop(graceful=False)
        done.wait(10)
        pytest.fail(f"the burst worker did not stop within {timeout}s")
    return w


def test_stops_once_the_queue_is_empty(app: Conveyor) -> None:
    @app.task(name="sq")
    def sq(n: int) -> int:
        return n * n

    jobs = [sq.enqueue(i) for i in range(20)]
    w = run_burst(app, concurrency=4)
    assert w.exit_code == 0
    assert [app.get_job(j.id).result for j in jobs] == [i * i for i in range(20)]
    assert w.counters.succeeded == 20


def test_an_empty_queue_stops_at_once(app: Conveyor) -> None:
    started = time.monotonic()
    run_burst(app)
    assert time.monotonic() - started < 5


def test_waits_for_running_jobs_and_what_they_enqueue(app: Conveyor) -> None:
    @app.task(name="child")
    def child(n: int) -> int:
        return n

    @app.task(name="parent")
    def parent() -> None:
        time.sleep(0.3)  # the claim that follows the first finds nothing while this runs
        child.enqueue(1)

    p = parent.enqueue()
    run_burst(app, concurrency=2)
    assert app.get_job(p.id).state is JobState.SUCCEEDED
    kids = app.backend.list_jobs(task="child").jobs
    assert [k.state for k in kids] == [JobState.SUCCEEDED]


def test_jobs_held_back_by_a_concurrency_limit_still_run(app: Conveyor) -> None:
    @app.task(name="one_at_a_time", concurrency_limit=1)
    def one_at_a_time(n: int) -> int:
        time.sleep(0.05)
        return n

    jobs = [one_at_a_time.enqueue(i) for i in range(4)]
    run_burst(app, concurrency=4)
    assert [app.get_job(j.id).state for j in jobs] == [JobState.SUCCEEDED] * 4


def test_a_job_not_due_yet_does_not_keep_it_running(app: Conveyor) -> None:
    @app.task(name="later")
    def later() -> None: ...

    job = later.options(delay=3600).enqueue()
    run_burst(app, timeout=10)
    assert app.get_job(job.id).state is JobState.SCHEDULED
