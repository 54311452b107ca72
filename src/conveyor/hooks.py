"""Lifecycle hooks: ``@app.on("job_started")`` and the other events a worker reports.

Each hook takes one argument, a :class:`HookEvent`. The job events' sync hooks run on the task's
own thread, immediately before and after the task (so thread-local resources, such as Django's
database connections, are handled where the task uses them); async hooks run on the worker's
event loop. A hook that raises is logged and skipped: it never fails the job or the worker.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from .errors import ConfigurationError

if TYPE_CHECKING:
    from .app import Conveyor
    from .backends.base import ErrorInfo
    from .job import Job

log = logging.getLogger("conveyor.hooks")

HookName = Literal["job_started", "job_succeeded", "job_failed", "job_dead",
                   "worker_started", "worker_stopping", "process_init"]
JOB_EVENTS = ("job_started", "job_succeeded", "job_failed", "job_dead")
WORKER_EVENTS = ("worker_started", "worker_stopping", "process_init")
EVENTS = JOB_EVENTS + WORKER_EVENTS

Hook = Callable[["HookEvent"], "Awaitable[None] | None"]
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class HookEvent:
    """What a hook is told. ``job`` is set for the job events; ``result`` (the value the task
    returned) for job_succeeded; ``error`` for job_failed (the attempt failed and the job will
    be retried) and job_dead (it failed for good); ``worker_id`` whenever a worker reports it."""

    name: str
    app: Conveyor
    job: Job | None = None
    result: Any = None
    error: ErrorInfo | None = None
    worker_id: str | None = None


@dataclass(frozen=True, slots=True)
class JobHooks:
    """What a worker's executions need to report job events: the app's hooks, and the worker
    (its id, and its loop for the async hooks of sync tasks)."""

    hooks: Hooks
    app: Conveyor
    worker_id: str | None
    loop: asyncio.AbstractEventLoop | None

    def event(self, name: str, job: Job, *, result: Any = None,
              error: ErrorInfo | None = None) -> HookEvent:
        return HookEvent(name, self.app, job, result, error, self.worker_id)


def _name_of(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


class Hooks:
    """An app's hooks by event, in the order they were registered."""

    def __init__(self) -> None:
        self._by_event: dict[str, list[tuple[Hook, bool]]] = {}  # (hook, is async)
        self._inited_pid: int | None = None  # process_init ran in this process
        self._user_job_hooks = 0
        # Built-in job hooks that only matter while these say so (tracing: a tracer provider
        # is set); while none does and no one else hooks a job event, jobs build no events.
        self._wanted: list[Callable[[], bool]] = []

    def add(self, name: str, fn: F, *, wanted: Callable[[], bool] | None = None) -> F:
        """Register ``fn`` for event ``name``. ``wanted`` (for built-in hooks): the hook does
        nothing while it returns False, so a job may skip its events altogether."""
        if name not in EVENTS:
            raise ConfigurationError(
                f"no hook event {name!r}; the events are {', '.join(EVENTS)}")
        if not callable(fn):
            raise ConfigurationError(f"a hook must be callable, got {fn!r}")
        self._by_event.setdefault(name, []).append((fn, inspect.iscoroutinefunction(fn)))
        if name in JOB_EVENTS:
            if wanted is None:
                self._user_job_hooks += 1
            elif wanted not in self._wanted:
                self._wanted.append(wanted)
        return fn

    def __contains__(self, name: str) -> bool:
        return name in self._by_event

    def any_job_hooks(self) -> bool:
        """Whether a job's events have anything to do (a worker without builds none)."""
        return self._user_job_hooks > 0 or any(wanted() for wanted in self._wanted)

    def run_on_thread(self, event: HookEvent, loop: asyncio.AbstractEventLoop | None) -> None:
        """From a task thread: run ``event``'s hooks in order, the sync ones here and the async
        ones on ``loop`` (waiting for each)."""
        for fn, is_async in self._by_event.get(event.name, ()):
            try:
                if is_async:
                    if loop is None or loop.is_closed():
                        raise RuntimeError("the worker's event loop is gone")
                    coro = fn(event)
                    assert inspect.isawaitable(coro)
                    _wait_on(loop, asyncio.run_coroutine_threadsafe(_awaited(coro), loop))
                else:
                    fn(event)
            except Exception:
                _failed(fn, event)

    async def run_on_loop(self, event: HookEvent) -> None:
        """On the event loop: run ``event``'s hooks in order, awaiting the async ones (sync ones
        run right here: the job events' for async tasks, whose thread this is)."""
        for fn, is_async in self._by_event.get(event.name, ()):
            try:
                if is_async:
                    coro = fn(event)
                    assert inspect.isawaitable(coro)
                    await coro
                else:
                    fn(event)
            except Exception:
                _failed(fn, event)

    async def process_init(self, event: HookEvent) -> None:
        """Run the process_init hooks, once per process (a fork's child runs them again)."""
        pid = os.getpid()
        if self._inited_pid == pid:
            return
        self._inited_pid = pid
        await self.run_on_loop(event)


def _wait_on(loop: asyncio.AbstractEventLoop, future: concurrent.futures.Future[None]) -> None:
    """Wait for a hook sent to ``loop``, for as long as the loop runs (a thread that outlived
    its worker must not wait forever for a loop that stopped)."""
    while True:
        try:
            return future.result(timeout=1.0)
        except TimeoutError:
            if not loop.is_running():
                future.cancel()
                raise RuntimeError("the worker's event loop stopped") from None


async def _awaited(awaitable: Awaitable[None]) -> None:
    await awaitable


def _failed(fn: Callable[..., Any], event: HookEvent) -> None:
    job = f" (job {event.job.id} {event.job.task})" if event.job is not None else ""
    log.exception("%s hook %s raised%s; ignored", event.name, _name_of(fn), job)
