"""``drain``: run every job waiting on an app's queues in this process, with the real worker
(burst mode), and hand back what ran; the test's own thread waits for it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from ..app import Conveyor
from ..errors import ConveyorError
from ..job import Job, JobState
from ..worker import Worker
from ..worker.runner import Runner

# ``advance=math.inf`` looks this far ahead: every store keeps such a time (PostgreSQL's
# timestamps end in the year 294276), and no job is scheduled later in practice.
_FOREVER_S = 100 * 365.25 * 86400.0
_PROMOTE_BATCH = 1000


class JobFailed(AssertionError):
    """A job that ``drain`` ran did not succeed: it is dead, or waits for a retry that
    ``advance`` did not reach. An AssertionError, so that pytest and unittest report a test
    failure. ``job`` is the job as stored; ``error`` its last error record (``type``,
    ``message``, ``traceback``: the task's exception as the worker caught it); ``failures``
    every job of the drain that did not succeed, this one first."""

    def __init__(self, job: Job, failures: Sequence[Job]) -> None:
        self.job = job
        self.error: dict[str, Any] = dict(job.last_error or {})
        self.failures = list(failures)
        err = self.error
        text = (f"job {job.id} ({job.task}) {job.state} after {job.attempts}/"
                f"{job.max_attempts} attempt(s): {err.get('type', '?')}: "
                f"{err.get('message', '')}")
        if len(self.failures) > 1:
            others = ", ".join(str(j.id) for j in self.failures[1:])
            text += f" (and {len(self.failures) - 1} more not succeeded: {others})"
        if err.get("traceback"):
            text += f"\n\nThe task's traceback:\n{str(err['traceback']).rstrip()}"
        super().__init__(text)


class DrainTimeout(ConveyorError, TimeoutError):
    """Jobs were still coming after ``timeout`` seconds (a task that enqueues itself, a rate
    limit that holds jobs back for longer): the drain stopped; ``ran`` is what ran."""

    def __init__(self, message: str, ran: Sequence[Job]) -> None:
        super().__init__(message)
        self.ran = list(ran)


class _RecordingRunner(Runner):
    """The worker's runner, noting each job it takes in (in order, once each)."""

    def __init__(self, w: Worker, ran: dict[int, None]) -> None:
        super().__init__(w)
        self.ran = ran

    def admit(self, job: Job) -> None:
        self.ran.setdefault(job.id)
        super().admit(job)


def drain(app: Conveyor, *, queues: Sequence[str] | None = None, advance: float = 0.0,
          raise_failures: bool = True, timeout: float = 60.0,
          concurrency: int = 1) -> list[Job]:
    """Run every job waiting on ``queues`` (default: every queue the app's tasks use) until
    none is left, jobs enqueued by those jobs included, and return the jobs that ran, as
    stored at the end, in the order they first started.

    The jobs run as in ``conveyor worker``: a real Worker in burst mode, here, with
    ``concurrency`` slots (1: one job at a time, in queue order), its signal handlers left
    alone and no cron schedules run. ``current_job()`` works in the tasks.

    ``advance`` (seconds, ``math.inf`` for all): also run scheduled jobs due within that
    long from the drain's start, on every queue: jobs enqueued with a delay and retries
    waiting out their backoff (which the worker schedules from the moment they fail). The
    clock itself is not moved: leases and rate limits keep real time.

    ``raise_failures``: raise :class:`JobFailed` if a job that ran did not succeed (dead, or
    waiting for a retry); else return it with the others (``job.errors``). Raises
    :class:`DrainTimeout` if jobs keep coming for ``timeout`` seconds. From a coroutine,
    ``await adrain(...)``.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("drain() was called from a running event loop: "
                           "use `await conveyor.testing.adrain(app)` there")
    return asyncio.run(adrain(app, queues=queues, advance=advance,
                              raise_failures=raise_failures, timeout=timeout,
                              concurrency=concurrency))


async def adrain(app: Conveyor, *, queues: Sequence[str] | None = None, advance: float = 0.0,
                 raise_failures: bool = True, timeout: float = 60.0,
                 concurrency: int = 1) -> list[Job]:
    """``drain`` for async code: the worker runs on the caller's event loop."""
    if not advance >= 0:
        raise ValueError(f"advance must be >= 0 seconds, got {advance!r}")
    names = list(queues) if queues else sorted(
        {t.queue for t in app.tasks.values()} or {app.default_queue})
    backend = await asyncio.to_thread(lambda: app.backend)  # opened (and migrated) off the loop
    horizon = None
    if advance > 0:
        horizon = await asyncio.to_thread(backend.now) + min(advance, _FOREVER_S)
    deadline = time.monotonic() + timeout
    ran: dict[int, None] = {}
    while True:
        # Due by the horizon: made available now. A round that runs jobs may schedule retries
        # that fall within it, hence another round, until one finds nothing to do.
        promoted = 0
        if horizon is not None:
            while (n := await asyncio.to_thread(backend.promote, limit=_PROMOTE_BATCH,
                                                now=horizon)):
                promoted += n
                if n < _PROMOTE_BATCH:
                    break
        before = len(ran)
        await _burst(app, names, concurrency, ran, deadline, timeout)
        if len(ran) == before and not promoted:
            break
    jobs = await asyncio.to_thread(_final, app, list(ran))
    failed = [j for j in jobs if j.state not in (JobState.SUCCEEDED, JobState.CANCELLED)]
    if failed and raise_failures:
        raise JobFailed(failed[0], failed)
    return jobs


async def _burst(app: Conveyor, queues: list[str], concurrency: int, ran: dict[int, None],
                 deadline: float, timeout: float) -> None:
    """One burst worker's run, until its queues are empty or the deadline."""
    w = Worker(app, queues=queues, concurrency=concurrency, burst=True, scheduler=False,
               install_signal_handlers=False, poll_interval=0.05, grace_period=0.0,
               worker_id=f"drain:{id(ran):x}")
    w.runner = _RecordingRunner(w, ran)
    run = asyncio.ensure_future(w.run_async())
    done, _ = await asyncio.wait([run], timeout=max(deadline - time.monotonic(), 0.0))
    if run in done:
        run.result()
        return
    w.stop(graceful=False)
    await asyncio.gather(run, return_exceptions=True)
    jobs = await asyncio.to_thread(_final, app, list(ran))
    raise DrainTimeout(f"jobs were still running or waiting after {timeout:g}s "
                       f"({len(jobs)} ran); is a task enqueueing itself?", jobs)


def _final(app: Conveyor, ids: list[int]) -> list[Job]:
    """The jobs as stored now (those deleted since, by a purge or retention, left out)."""
    jobs = []
    for job_id in ids:
        job = app.backend.get(job_id)
        if job is not None:
            jobs.append(job)
    return jobs


__all__ = ["DrainTimeout", "JobFailed", "adrain", "drain"]
