"""Waiting for a job to finish: ``job.wait(timeout=...)`` and ``await job.wait_async(...)``.

The store does the waiting (``Backend.wait_finished``): it wakes the waiter when the job
finishes (LISTEN/NOTIFY on PostgreSQL, a list the finishing script pushes to on Redis, an
in-process signal on SQLite) and looks at the job row now and then in case a wake-up was
missed. Here: which app a Job belongs to, the refusal inside a task, and the async form.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .errors import ConfigurationError, JobNotFound, WaitInTask, WaitTimeout
from .executor import current_job
from .job import Job

if TYPE_CHECKING:
    from .app import Conveyor

# The longest single store wait behind wait_async: a cancelled wait_async frees its thread
# within this many seconds.
ASYNC_SLICE = 1.0

_IN_TASK = (
    "job.wait() inside a task is refused: the task holds a worker slot while it waits, and "
    "when every slot waits on jobs that need a slot to run, the pool deadlocks. Enqueue a "
    "follow-up job instead, or pass disable_sync_subtasks=False if you know a free worker "
    "will run the job (as Celery's result.get())."
)


def bind(job: Job, app: Conveyor) -> Job:
    """Remember which app ``job`` came from, so ``job.wait()`` knows its store. Not a field:
    the job compares, prints and pickles as the snapshot it is."""
    job.__dict__["_app"] = app
    return job


def _app_of(job: Job) -> Conveyor:
    app: Conveyor | None = job.__dict__.get("_app")
    if app is None:
        raise ConfigurationError(
            f"job {job.id} does not know its app (it did not come from enqueue or "
            "app.get_job): wait with app.get_job(job_id).wait(...)")
    return app


def _check_timeout(timeout: float | None) -> float:
    if timeout is None:
        return math.inf
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0:
        raise ConfigurationError(
            f"timeout must be a number of seconds >= 0 or None, got {timeout!r}")
    return float(timeout)


def _refuse_in_task(disable_sync_subtasks: bool) -> None:
    if disable_sync_subtasks and current_job() is not None:
        raise WaitInTask(_IN_TASK)


def _finished(job: Job, seen: Job | None, timeout: float | None) -> Job:
    if seen is None:
        raise JobNotFound(f"no job with id {job.id} (deleted while waited for?)")
    if not seen.is_final:
        raise WaitTimeout(seen, timeout)
    return seen


def wait(job: Job, timeout: float | None, disable_sync_subtasks: bool) -> Job:
    """See ``Job.wait``."""
    _refuse_in_task(disable_sync_subtasks)
    app = _app_of(job)
    limit = _check_timeout(timeout)
    seen = app.backend.wait_finished(job.id, limit)
    return bind(_finished(job, seen, timeout), app)


async def wait_async(job: Job, timeout: float | None, disable_sync_subtasks: bool) -> Job:
    """See ``Job.wait_async``. The store's wait blocks, so it runs on a thread of its own (not
    the loop's default executor, which a few waiters would fill), in slices: a cancelled
    wait_async leaves its thread within ASYNC_SLICE seconds."""
    _refuse_in_task(disable_sync_subtasks)
    app = _app_of(job)
    deadline = time.monotonic() + _check_timeout(timeout)
    backend = app.backend
    while True:
        remaining = max(0.0, deadline - time.monotonic())
        seen = await _on_thread(backend.wait_finished, job.id, min(remaining, ASYNC_SLICE))
        if seen is None or seen.is_final or remaining <= ASYNC_SLICE:
            return bind(_finished(job, seen, timeout), app)


async def _on_thread(fn: Callable[[int, float], Job | None], job_id: int,
                     timeout: float) -> Job | None:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Job | None] = loop.create_future()

    def settle(result: Job | None, error: BaseException | None) -> None:
        if future.done():
            return  # cancelled meanwhile
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        result: Job | None = None
        error: BaseException | None = None
        try:
            result = fn(job_id, timeout)
        except BaseException as exc:  # handed to the awaiting coroutine
            error = exc
        # A closed loop raises RuntimeError: nobody awaits the answer any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name=f"conveyor-wait-{job_id}", daemon=True).start()
    return await future
