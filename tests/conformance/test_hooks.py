"""Lifecycle hooks (``@app.on``) on every backend: which events fire, with what, on which
thread, and that a failing hook never fails the job or the worker."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest
from support import running_worker, wait_for_job, wait_until

from conveyor import Conveyor, HookEvent, JobState, Reject, RetryPolicy, current_job


def recorder(app: Conveyor, *names: str) -> list[tuple[str, HookEvent, str]]:
    """Register a sync hook for each of ``names`` that records (name, event, thread name)."""
    seen: list[tuple[str, HookEvent, str]] = []
    for name in names:
        @app.on(name)
        def record(event: HookEvent, name: str = name) -> None:
            seen.append((name, event, threading.current_thread().name))
    return seen


@pytest.mark.needs("lookup")
def test_sync_hooks_run_on_the_task_thread_before_and_after_it(app: Conveyor) -> None:
    threads: dict[str, str] = {}
    order: list[str] = []
    seen = recorder(app, "job_started", "job_succeeded")

    @app.on("job_started")
    def started(event: HookEvent) -> None:
        order.append("started")
        # Inside the job: current_job() works in a hook as in the task.
        ctx = current_job()
        assert ctx is not None and ctx.job.id == event.job.id  # type: ignore[union-attr]

    @app.on("job_succeeded")
    def succeeded(event: HookEvent) -> None:
        order.append("succeeded")

    @app.task(name="double")
    def double(n: int) -> dict[str, int]:
        threads["task"] = threading.current_thread().name
        order.append("task")
        return {"n": n * 2}

    job = double.enqueue(21)
    with running_worker(app, concurrency=2) as wt:
        assert wait_for_job(app, job.id).state is JobState.SUCCEEDED
        worker_id = wt.worker.id
    assert order == ["started", "task", "succeeded"]
    [(_, start, t1), (_, done, t2)] = seen
    assert t1 == t2 == threads["task"]
    assert start.name == "job_started" and done.name == "job_succeeded"
    assert start.app is app and start.job is not None and start.job.id == job.id
    assert start.worker_id == done.worker_id == worker_id
    assert done.result == {"n": 42} and done.error is None
    assert start.result is None and start.error is None


@pytest.mark.needs("lookup")
def test_async_hooks_run_on_the_loop_around_an_async_task(app: Conveyor) -> None:
    order: list[tuple[str, str]] = []
    loops: set[int] = set()

    @app.on("job_started")
    async def started(event: HookEvent) -> None:
        loops.add(id(asyncio.get_running_loop()))
        order.append(("async-started", threading.current_thread().name))

    @app.on("job_started")
    def started_sync(event: HookEvent) -> None:
        order.append(("sync-started", threading.current_thread().name))

    @app.on("job_succeeded")
    async def succeeded(event: HookEvent) -> None:
        loops.add(id(asyncio.get_running_loop()))
        order.append((f"async-succeeded {event.result}", threading.current_thread().name))

    @app.task(name="atask")
    async def atask() -> str:
        loops.add(id(asyncio.get_running_loop()))
        order.append(("task", threading.current_thread().name))
        return "ok"

    job = atask.enqueue()
    with running_worker(app):
        assert wait_for_job(app, job.id).state is JobState.SUCCEEDED
    assert [o for o, _ in order] == ["async-started", "sync-started", "task",
                                     "async-succeeded ok"]
    assert len({t for _, t in order}) == 1  # all on the loop's thread
    assert len(loops) == 1


@pytest.mark.needs("lookup")
def test_async_hooks_around_a_sync_task_run_on_the_loop_before_and_after_it(
        app: Conveyor) -> None:
    order: list[str] = []

    @app.on("job_started")
    async def started(event: HookEvent) -> None:
        order.append("started")

    @app.on("job_succeeded")
    async def succeeded(event: HookEvent) -> None:
        order.append("succeeded")

    @app.task(name="plain")
    def plain() -> None:
        order.append("task")

    job = plain.enqueue()
    with running_worker(app):
        wait_for_job(app, job.id)
    assert order == ["started", "task", "succeeded"]


@pytest.mark.needs("lookup")
def test_failed_then_dead(app: Conveyor) -> None:
    seen = recorder(app, "job_started", "job_succeeded", "job_failed", "job_dead")

    @app.task(name="flaky", max_attempts=2, retry=RetryPolicy(base=0.0))
    def flaky() -> None:
        raise ConnectionError("down")

    @app.task(name="refused")
    def refused() -> None:
        raise Reject("bad input")

    a, b = flaky.enqueue(), refused.enqueue()
    with running_worker(app):
        assert wait_for_job(app, a.id).state is JobState.DEAD
        assert wait_for_job(app, b.id).state is JobState.DEAD
    by_job: dict[int, list[str]] = {}
    for name, event, _ in seen:
        assert event.job is not None
        by_job.setdefault(event.job.id, []).append(name)
    assert by_job[a.id] == ["job_started", "job_failed", "job_started", "job_dead"]
    assert by_job[b.id] == ["job_started", "job_dead"]
    failed = next(e for n, e, _ in seen if n == "job_failed")
    assert failed.error is not None and failed.error.type == "ConnectionError"
    assert failed.error.message == "down" and failed.job.attempts == 1  # type: ignore[union-attr]
    dead = next(e for n, e, _ in seen if n == "job_dead" and e.job.id == b.id)  # type: ignore[union-attr]
    assert dead.error is not None and dead.error.kind == "rejected"


@pytest.mark.needs("lookup")
def test_a_job_that_cannot_start_is_dead_without_being_started(app: Conveyor) -> None:
    seen = recorder(app, "job_started", "job_dead")

    @app.task(name="gone")
    def gone() -> None: ...

    job = gone.enqueue()
    del app.tasks["gone"]  # the worker does not know the task
    with running_worker(app):
        assert wait_for_job(app, job.id).state is JobState.DEAD
    assert [(n, e.error.kind) for n, e, _ in seen] == [("job_dead", "unknown_task")]  # type: ignore[union-attr]


@pytest.mark.needs("lookup")
def test_a_sync_task_past_its_timeout_fails_on_its_thread_when_it_returns(
        app: Conveyor) -> None:
    seen = recorder(app, "job_started", "job_succeeded", "job_dead")
    threads: list[str] = []

    @app.task(name="slow", timeout=0.1, max_attempts=1)
    def slow() -> str:
        threads.append(threading.current_thread().name)
        threading.Event().wait(0.4)
        return "too late"

    job = slow.enqueue()
    with running_worker(app):
        assert wait_for_job(app, job.id).state is JobState.DEAD
        wait_until(lambda: len(seen) == 2, timeout=5)
    assert [n for n, _, _ in seen] == ["job_started", "job_dead"]
    assert seen[1][1].error is not None and seen[1][1].error.kind == "timeout"
    assert seen[1][2] == threads[0]


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.needs("lookup")
def test_a_failing_hook_is_logged_and_fails_nothing(
        app: Conveyor, caplog: pytest.LogCaptureFixture, kind: str) -> None:
    ran: list[str] = []

    def boom(event: HookEvent) -> None:
        raise RuntimeError(f"hook broke on {event.name}")

    async def aboom(event: HookEvent) -> None:
        raise RuntimeError(f"hook broke on {event.name}")

    hook: Callable[..., Any] = boom if kind == "sync" else aboom
    for name in ("job_started", "job_succeeded", "worker_started", "worker_stopping",
                 "process_init"):
        app.on(name)(hook)

    @app.task(name="fine")
    def fine() -> int:
        ran.append("task")
        return 1

    job = fine.enqueue()
    with caplog.at_level(logging.ERROR, logger="conveyor.hooks"), running_worker(app):
        assert wait_for_job(app, job.id).state is JobState.SUCCEEDED
    assert ran == ["task"]
    logged = [r for r in caplog.records if r.name == "conveyor.hooks"]
    assert any("job_started" in r.getMessage() and hook.__name__ in r.getMessage()
               for r in logged)
    assert any("job_succeeded" in r.getMessage() for r in logged)
    assert any("worker_stopping" in r.getMessage() for r in logged)


def test_worker_events_and_process_init_once(make_app: Callable[..., Conveyor]) -> None:
    app = make_app()
    seen = recorder(app, "process_init", "worker_started", "worker_stopping")

    @app.task(name="noop")
    def noop() -> None: ...

    with running_worker(app) as first:
        pass
    with running_worker(app) as second:
        pass
    names = [n for n, _, _ in seen]
    # process_init once in this process, however many workers it runs after the first.
    assert names == ["process_init", "worker_started", "worker_stopping",
                     "worker_started", "worker_stopping"]
    assert seen[1][1].worker_id == first.worker.id and seen[3][1].worker_id == second.worker.id
    assert all(e.job is None for _, e, _ in seen)
