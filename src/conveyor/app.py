"""The Conveyor app: a store URL, settings, and the registry of tasks."""

from __future__ import annotations

import importlib
import os
import re
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

from . import payload, tracing
from .backends import absolute_url, open_backend, redact_url
from .backends.base import Backend, BatchInfo
from .cron import Schedule
from .errors import ConfigurationError, IncludeError, InvalidName, JobNotFound, UnknownTask
from .hooks import Hooks
from .job import Job
from .payload import DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_MAX_RESULT_BYTES, check_queue_name
from .retry import ExceptionFilter, RetryPolicy, exception_classes
from .signing import Signer
from .task import Task
from .waiting import bind
from .workflow import Batch, Group, Signature, Step, chain

if TYPE_CHECKING:
    from .metrics import Metrics

P = ParamSpec("P")
R = TypeVar("R")
H = TypeVar("H", bound=Callable[..., Any])

DEFAULT_URL = "sqlite:///conveyor.db"
# What ``include`` accepts: a dotted module name, as ``import`` takes it.
_MODULE_RE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def _check_include(include: Sequence[str]) -> tuple[str, ...]:
    # A bare string would be iterated as one module per character.
    if isinstance(include, str) or not isinstance(include, Sequence):
        raise ConfigurationError(
            f"include must be a list of module names, e.g. ['myapp.tasks'], got {include!r}")
    for module in include:
        if not isinstance(module, str) or not _MODULE_RE.fullmatch(module):
            raise ConfigurationError(
                f"include: {module!r} is not a module name (dotted, as `import` takes it, "
                "e.g. 'myapp.tasks')")
    return tuple(include)


def _refuse_after(after: object) -> None:
    # Named so that a port of a dependent periodic job gets this rather than a TypeError.
    if after is not None:
        raise ConfigurationError(
            "a cron schedule cannot have after=: each tick is a new job with no parents; "
            "enqueue the dependent jobs from the cron task (app.chain, after=[...])")


class Conveyor:
    """One app: where jobs are stored and which tasks exist.

    ``url`` is ``sqlite:///file.db``, ``postgresql://...``, ``redis://...`` or a message
    broker, ``amqp://...`` (RabbitMQ); without it, ``$CONVEYOR_URL``, then
    ``sqlite:///conveyor.db``; ``state`` (or ``$CONVEYOR_STATE_URL``) names a broker's
    companion store, which keeps the job records a broker cannot (docs/backends.md). A
    relative SQLite path is made absolute against the current directory when the app is
    created. ``visibility_timeout`` is the lease
    length in seconds: a worker that stops heartbeating for that long loses its jobs to other
    workers.
    ``max_payload_bytes`` caps a job's arguments as JSON (enqueue raises PayloadTooLarge);
    ``max_result_bytes`` caps a result or a step's (the job goes dead, ``result_too_large``).
    ``signing_key`` (16+ bytes) signs every job it enqueues; a worker of an app with a key
    runs only jobs signed with it or one of ``verify_keys`` (see :mod:`conveyor.signing`).
    ``pool_size`` fixes PostgreSQL's connection pool (default: 10 plus the concurrency of the
    workers running in the process; ``?pool_max_size=`` in the URL does the same); only
    PostgreSQL has one to size.
    ``include`` names the modules that define the app's tasks (``["myapp.tasks",
    "myapp.billing.tasks"]``): a worker, and the commands that need the tasks (``enqueue``,
    ``cron list``), import them (:meth:`import_includes`), so tasks may live in any module
    without the app module importing them all.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        visibility_timeout: float = 30.0,
        default_queue: str = "default",
        default_timeout: float = 60.0,
        default_max_attempts: int = 10,
        retry: RetryPolicy | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        result_ttl: float = 86400.0,
        dead_ttl: float | None = None,
        history_days: float = 7.0,
        signing_key: str | bytes | None = None,
        verify_keys: Sequence[str | bytes] = (),
        pool_size: int | None = None,
        include: Sequence[str] = (),
        state: str | None = None,
    ) -> None:
        self.include = _check_include(include)
        self.url = url or os.environ.get("CONVEYOR_URL") or DEFAULT_URL
        state = state or os.environ.get("CONVEYOR_STATE_URL") or None
        self.state_url = absolute_url(state) if state else None
        if pool_size is not None and (isinstance(pool_size, bool) or not isinstance(pool_size, int)
                                      or pool_size < 1):
            raise ConfigurationError(f"pool_size must be an int >= 1 or None, got {pool_size!r}")
        self.pool_size = pool_size
        if not visibility_timeout > 0:
            raise ConfigurationError(
                f"visibility_timeout must be > 0 seconds, got {visibility_timeout!r}")
        if max_payload_bytes <= 0:
            raise ConfigurationError(f"max_payload_bytes must be > 0, got {max_payload_bytes!r}")
        if max_result_bytes <= 0:
            raise ConfigurationError(f"max_result_bytes must be > 0, got {max_result_bytes!r}")
        self.visibility_timeout = float(visibility_timeout)
        self.default_queue = default_queue
        self.default_timeout = float(default_timeout)
        self.default_max_attempts = default_max_attempts
        self.retry_policy = retry or RetryPolicy(base=2.0, factor=2.0, cap=3600.0)
        self.max_payload_bytes = max_payload_bytes
        self.max_result_bytes = max_result_bytes  # of a result or a step's, as JSON
        self.result_ttl = result_ttl  # seconds succeeded/cancelled jobs are kept (0: forever)
        if dead_ttl is not None and not dead_ttl > 0:
            raise ConfigurationError(
                f"dead_ttl must be > 0 seconds or None (keep), got {dead_ttl!r}")
        self.dead_ttl = dead_ttl  # seconds dead jobs are kept; None: until purged
        if not history_days > 0:
            raise ConfigurationError(f"history_days must be > 0, got {history_days!r}")
        # Days the store keeps the hourly history (minute rows roll up into hours after a day).
        self.history_days = float(history_days)
        # HMAC of every job's task, queue and arguments; workers then run only signed jobs.
        self.signer = Signer(signing_key, verify_keys) if signing_key is not None else None
        if verify_keys and signing_key is None:
            raise ConfigurationError(
                "verify_keys needs a signing_key (the key new jobs are signed with)")
        self.tasks: dict[str, Task[Any, Any]] = {}
        self.max_depths: dict[str, int] = {}
        self.schedules: dict[str, Schedule] = {}
        self.metrics: Metrics | None = None  # set by enable_metrics()
        self.hooks = Hooks()  # @app.on(...); the worker's OpenTelemetry spans are hooks too
        tracing.install(self.hooks)
        self._backend: Backend | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        """The store URL; a relative SQLite path was made absolute when it was set."""
        return self._url

    @url.setter
    def url(self, url: str) -> None:
        self._url = absolute_url(url)

    @property
    def backend(self) -> Backend:
        """The store, opened (and migrated) on first use."""
        if self._backend is None:
            with self._lock:
                if self._backend is None:
                    self._backend = open_backend(self.url, pool_size=self.pool_size,
                                                 state=self.state_url)
        return self._backend

    def import_includes(self) -> dict[str, list[str]]:
        """Import the modules of ``include`` (each once, as ``import`` does) and return the
        tasks each defines, by name. A module that fails to import raises IncludeError (a
        ConfigurationError) naming it, with the module's exception as its ``__cause__``."""
        for module in self.include:
            try:
                importlib.import_module(module)
            except Exception as exc:
                raise IncludeError(module, exc) from exc
        by_module = self.tasks_by_module()
        return {module: by_module.get(module, []) for module in self.include}

    def tasks_by_module(self) -> dict[str, list[str]]:
        """The registered tasks' names, sorted, by the module that defines each function."""
        out: dict[str, list[str]] = {}
        for name, t in sorted(self.tasks.items()):
            out.setdefault(getattr(t.fn, "__module__", None) or "?", []).append(name)
        return out

    def task_listing(self) -> list[str]:
        """``tasks from <module>: <names>`` per module (names shown without the module's prefix),
        an ``include`` module without tasks too: what a worker logs when it starts."""
        by_module = self.tasks_by_module()
        for module in self.include:
            by_module.setdefault(module, [])
        return [f"tasks from {module}: "
                + (", ".join(n.removeprefix(f"{module}.") for n in names) or "none")
                for module, names in by_module.items()]

    @overload
    def task(self, fn: Callable[P, R]) -> Task[P, R]: ...

    @overload
    def task(
        self, *, name: str | None = None, queue: str | None = None, max_attempts: int | None = None,
        timeout: float | None = None, priority: int = 0, retry: RetryPolicy | None = None,
        concurrency_limit: int | None = None, rate_limit: str | tuple[int, float] | None = None,
        retry_on: ExceptionFilter | None = None, dead_on: ExceptionFilter | None = None,
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    def task(
        self, fn: Callable[..., Any] | None = None, *, name: str | None = None,
        queue: str | None = None, max_attempts: int | None = None, timeout: float | None = None,
        priority: int = 0,
        retry: RetryPolicy | None = None, concurrency_limit: int | None = None,
        rate_limit: str | tuple[int, float] | None = None,
        retry_on: ExceptionFilter | None = None, dead_on: ExceptionFilter | None = None,
    ) -> Any:
        """Register a function as a task: ``@app.task`` or
        ``@app.task(queue="emails", max_attempts=5)``.

        Its name is ``name=``, else ``module.function``, where a function defined in the script
        being run is named after the script's file, as the worker imports it (``tasks.send``
        for ``python tasks.py``, not ``__main__.send``).

        ``concurrency_limit=N``: at most N of its jobs run at once across all workers;
        ``rate_limit="100/m"``: at most 100 start per minute. Both are kept by the store and
        keyed by the task's name; per call, ``options(concurrency_key=..., rate_key=...)``
        limits by another key (a customer, an API) instead.

        ``retry_on=(ConnectionError, TimeoutError)``: only these exceptions (and their
        subclasses) are retried, any other goes dead at once; ``dead_on=(ValueError,)``: these
        go dead at once whatever ``retry_on`` says. A timeout counts as a TimeoutError;
        ``raise Retry`` is always retried. Exception classes only, checked here.
        """
        retry_filter = exception_classes(retry_on, "retry_on") if retry_on is not None else None
        dead_filter = exception_classes(dead_on, "dead_on") if dead_on is not None else ()

        def register(f: Callable[..., Any]) -> Task[Any, Any]:
            task_name = name if name is not None else f"{module_name(f)}.{f.__qualname__}"
            if task_name in self.tasks and self.tasks[task_name].fn is not f:
                raise ConfigurationError(
                    f"a different function is already registered as task {task_name!r}")
            t = Task(
                self, f, name=task_name, queue=queue if queue is not None else self.default_queue,
                max_attempts=(max_attempts if max_attempts is not None
                              else self.default_max_attempts),
                timeout=timeout if timeout is not None else self.default_timeout,
                priority=priority, retry=retry or self.retry_policy,
                concurrency_limit=concurrency_limit, rate_limit=rate_limit,
                retry_on=retry_filter, dead_on=dead_filter,
            )
            self.tasks[task_name] = t
            return t

        return register(fn) if fn is not None else register

    def on(self, event: str) -> Callable[[H], H]:
        """Register a lifecycle hook: ``@app.on("job_failed")``. Events: job_started,
        job_succeeded, job_failed (the attempt failed, the job will retry), job_dead (failed for
        good), worker_started, worker_stopping, process_init (once in each worker process,
        before any job). The hook, sync or ``async def``, takes one :class:`HookEvent`. Sync
        hooks of the job events run on the task's own thread just before and after the task;
        async ones on the worker's event loop. A hook that raises is logged, never failing the
        job or the worker. See docs/hooks.md."""

        def register(fn: H) -> H:
            return self.hooks.add(event, fn)

        return register

    def cron(
        self, expression: str, *, name: str | None = None, timezone: str = "UTC",
        kwargs: dict[str, Any] | None = None, priority: int = 0, queue: str | None = None,
        max_attempts: int | None = None, timeout: float | None = None,
        retry: RetryPolicy | None = None, retry_on: ExceptionFilter | None = None,
        dead_on: ExceptionFilter | None = None, after: Any = None,
    ) -> Callable[[Callable[P, R]], Task[P, R]]:
        """Register a function as a task and enqueue it at every tick of a cron expression:
        ``@app.cron("*/5 * * * *", timezone="Europe/Paris")``. The schedule is named after the
        task unless ``name`` is given; ``kwargs`` are passed to every run. Workers run the
        scheduler; see :mod:`conveyor.cron` for the misfire and daylight-saving rules."""
        _refuse_after(after)
        as_task = self.task(queue=queue, max_attempts=max_attempts, timeout=timeout,
                            priority=priority, retry=retry, retry_on=retry_on, dead_on=dead_on)

        def register(f: Callable[P, R]) -> Task[P, R]:
            t = f if isinstance(f, Task) else as_task(f)
            self.schedule(t, expression, name=name, timezone=timezone, kwargs=kwargs,
                          priority=priority)
            return t

        return register

    def schedule(
        self, task: Task[Any, Any] | str, expression: str, *, name: str | None = None,
        timezone: str = "UTC", kwargs: dict[str, Any] | None = None, priority: int = 0,
        queue: str | None = None, after: Any = None,
    ) -> Schedule:
        """Enqueue an already registered task at every tick of ``expression`` (see ``cron``)."""
        _refuse_after(after)
        t = self.get_task(task) if isinstance(task, str) else task
        call = dict(kwargs or {})
        # Bound and encoded now: a bad schedule fails when it is declared, not at 3 am.
        payload.bind_arguments(t.fn, (), call, task_name=t.name, sig=t.signature)
        payload.encode(call, what=f"kwargs of cron schedule for {t.name}",
                       limit=self.max_payload_bytes)
        sched = Schedule(
            name=name or t.name, expression=expression, task=t.name, queue=queue or t.queue,
            timezone=timezone, kwargs=call, priority=priority,
        )
        existing = self.schedules.get(sched.name)
        if existing is not None and existing != sched:
            raise ConfigurationError(
                f"a different cron schedule is already named {sched.name!r}; "
                "pass name= to tell them apart"
            )
        self.schedules[sched.name] = sched
        return sched

    def queue(self, name: str, *, max_depth: int | None) -> None:
        """Configure a queue. ``max_depth``: at most this many jobs waiting (scheduled or
        available); an enqueue past it raises QueueFull and writes nothing. None removes it."""
        check_queue_name(name)
        if max_depth is None:
            self.max_depths.pop(name, None)
            return
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1:
            raise ConfigurationError(
                f"max_depth of queue {name!r} must be an int >= 1, got {max_depth!r}")
        self.max_depths[name] = max_depth

    def enable_metrics(self, *, store: bool = True) -> Metrics:
        """Record Prometheus metrics in this process (enqueues; a worker's attempts, run times,
        lag); with ``store``, also export store-wide gauges read at scrape time."""
        from .metrics import Metrics

        if self.metrics is None:
            self.metrics = Metrics()
        if store:
            self.metrics.watch_store(self.backend)
        return self.metrics

    def get_task(self, name: str) -> Task[Any, Any]:
        """The registered task called ``name``. Raises UnknownTask (listing the known ones)."""
        try:
            return self.tasks[name]
        except KeyError:
            known = ", ".join(sorted(self.tasks)) or "none"
            raise UnknownTask(f"no task named {name!r} is registered (known: {known})") from None

    def get_job(self, job_id: int) -> Job:
        """The job as the store has it now. Raises JobNotFound."""
        if isinstance(job_id, bool) or not isinstance(job_id, int):
            raise InvalidName(f"job id must be an int, got {job_id!r}")
        job = self.backend.get(job_id)
        if job is None:
            raise JobNotFound(f"no job with id {job_id}")
        return bind(job, self)

    def chain(self, *steps: Step, pass_result: bool = False) -> list[Job]:
        """Enqueue ``steps`` (``task.s(...)`` or ``app.group(...)``) so that each waits for the
        one before it, in one atomic write, and return their jobs in order: the last one's
        ``wait()`` gives the chain's result. A step's parent failing (dead, cancelled) cancels
        the rest. ``pass_result=True``: each step after the first gets its parent's result as
        its first argument (after a group, the list of the group's results, in order); its
        other arguments are given in ``.s(...)`` as usual. See docs/workflows.md."""
        return chain(self, steps, pass_result=pass_result)

    def group(self, *signatures: Signature) -> Group:
        """Signatures that run side by side, as one step of ``app.chain``."""
        return Group(tuple(signatures))

    def batch(self, *, on_success: Signature | None = None,
              on_complete: Signature | None = None) -> Batch:
        """``with app.batch(on_success=report.s(), on_complete=cleanup.s()) as b:``: every
        enqueue in the block is written at its end, in one atomic write, as members of batch
        ``b.id``; ``on_success`` runs once if every member succeeded, ``on_complete`` once
        when every member has finished, however it finished. A callback whose function takes
        a ``batch_id`` parameter gets the batch's id there. Inside the block, enqueue returns
        a pending handle (usable in ``after=``; ``handle.job`` once the block has ended). An
        exception in the block writes nothing. See docs/workflows.md."""
        return Batch(self, on_success, on_complete)

    def get_batch(self, batch_id: str) -> BatchInfo | None:
        """A batch's counts (total, waiting, pending, succeeded, dead, cancelled) and its
        callbacks' job ids, or None if the store holds no such batch (never written, or pruned
        with its last member)."""
        if not isinstance(batch_id, str) or not batch_id:
            raise InvalidName(f"batch id must be a non-empty str, got {batch_id!r}")
        return self.backend.get_batch(batch_id)

    def cancel(self, job_id: int) -> bool:
        """Cancel a waiting job (it never runs) or a running one (its worker stops it: async
        tasks are cancelled, sync ones see ``current_job().cancelled``). False if the job is
        unknown or already finished."""
        return self.backend.cancel(job_id)

    def close(self) -> None:
        """Close the store's connections. The app opens them again if used afterwards."""
        if self._backend is not None:
            self._backend.close()
            self._backend = None

    def __repr__(self) -> str:
        return f"<Conveyor {redact_url(self.url)} tasks={len(self.tasks)}>"


def module_name(f: Callable[..., Any]) -> str:
    """The module a task's default name starts with. A function defined in the script being run
    (``python tasks.py``, ``python -m tasks``) has ``__module__ == "__main__"``, while the worker
    imports the same file as ``tasks``: named ``__main__.f``, every job enqueued by the script
    would be an unknown task to the worker. So ``__main__`` is named as the worker imports it:
    the module ``-m`` ran, else the script file's name."""
    module = getattr(f, "__module__", None) or "?"
    if module != "__main__":
        return module
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":
        return str(spec.name)
    path = getattr(main, "__file__", None)
    return Path(path).stem if path else module
