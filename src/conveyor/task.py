"""Tasks: a registered function plus its defaults, and the enqueue calls on it."""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import inspect
import json
import math
import operator
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generic, NoReturn, ParamSpec, TypeVar, cast

from . import payload, pending, signing, tracing
from .backends.base import (
    Backend,
    EnqueueResult,
    NewBatch,
    NewJob,
    TransactionalStore,
    transactional,
)
from .errors import ArgumentsError, ConfigurationError, JobNotFound, PayloadError, QueueFull
from .job import Job, JobState, fast_constructor
from .retry import ExceptionClasses, RetryPolicy
from .waiting import bind

if TYPE_CHECKING:
    from .app import Conveyor
    from .workflow import Signature

P = ParamSpec("P")
R = TypeVar("R")
# The NewJob fields that make a kind of job in built(): the same for every job of one call.
_JOB_KIND = ("task", "queue", "max_attempts", "priority", "timeout", "unique_key", "fair_key",
             "concurrency_key", "concurrency_limit", "rate_key", "rate_limit", "rate_period")

_kind_of = operator.attrgetter(*_JOB_KIND)
# An args text as payload.encode wrote it, which starts and ends with its value (no whitespace).
_raw_decode = json.JSONDecoder().raw_decode


@functools.lru_cache(maxsize=256)
def _job_maker(kind: tuple[Any, ...]) -> Callable[..., Job]:
    """A new job's constructor, kept per kind rather than built per call (see
    docs/benchmarks.md, "Design measurements")."""
    return fast_constructor(Job, dict(zip(_JOB_KIND, kind, strict=True), attempts=0))

PRIORITY_MIN, PRIORITY_MAX = -32768, 32767
UNIQUE_KEY_MAX = 255


@dataclass(frozen=True)
class EnqueueOptions:
    queue: str
    max_attempts: int
    timeout: float
    priority: int = 0
    delay: float = 0.0
    run_at: float | None = None
    unique_key: str | None = None
    connection: Any = field(default=None, compare=False)  # transactional enqueue (PostgreSQL)
    wait_if_full: float = 0.0  # seconds to keep retrying a full queue before raising QueueFull
    unique_for: float | None = None  # seconds a succeeded job keeps answering for its unique_key
    fair_key: str | None = None  # tenant: the queue is shared round-robin between fair keys
    concurrency_key: str | None = None  # at most concurrency_limit running jobs with this key
    concurrency_limit: int | None = None
    rate_key: str | None = None  # at most rate_limit claims per rate_period seconds with this key
    rate_limit: int | None = None
    rate_period: float | None = None
    # Dependencies: Jobs' ids, or handles of jobs pending in an open batch block (pending.py).
    after: tuple[Any, ...] = ()
    on_parent_failure: str = "cancel"  # or "run": what a parent going dead/cancelled does


def _transactional(backend: Backend) -> TransactionalStore:
    """The app's store as one whose writes can join the caller's transaction, or raise."""
    store = transactional(backend)
    if store is None:
        raise ConfigurationError(
            "enqueue with connection= needs the PostgreSQL backend (the job joins your "
            f"transaction); this app uses {type(backend).__name__}"
        )
    return store


def _is_async_connection(connection: object) -> bool:
    return inspect.iscoroutinefunction(getattr(connection, "commit", None))


def _check_options(opts: EnqueueOptions) -> EnqueueOptions:
    payload.check_queue_name(opts.queue)
    if (not isinstance(opts.max_attempts, int) or isinstance(opts.max_attempts, bool)
            or opts.max_attempts < 1):
        raise ConfigurationError(f"max_attempts must be an int >= 1, got {opts.max_attempts!r}")
    if not _finite(opts.timeout) or opts.timeout <= 0:
        raise ConfigurationError(
            f"timeout must be a positive number of seconds, got {opts.timeout!r} "
            "(there is no 'forever')"
        )
    if not isinstance(opts.priority, int) or isinstance(opts.priority, bool) or not (
        PRIORITY_MIN <= opts.priority <= PRIORITY_MAX
    ):
        raise ConfigurationError(
            f"priority must be an int in [{PRIORITY_MIN}, {PRIORITY_MAX}], got {opts.priority!r}")
    if not _finite(opts.delay) or opts.delay < 0:
        raise ConfigurationError(
            f"delay must be a non-negative number of seconds, got {opts.delay!r}")
    if opts.run_at is not None and not _finite(opts.run_at):
        raise ConfigurationError(f"run_at must be a datetime or unix time, got {opts.run_at!r}")
    if opts.unique_for is not None and (not _finite(opts.unique_for) or opts.unique_for <= 0):
        raise ConfigurationError(
            f"unique_for must be a positive number of seconds, got {opts.unique_for!r}")
    if opts.unique_for is not None and opts.unique_key is None:
        raise ConfigurationError(
            "unique_for needs a unique_key: it is how long that key stays taken after success")
    for what in ("unique_key", "fair_key", "concurrency_key", "rate_key"):
        _check_key(what, getattr(opts, what))
    if (opts.concurrency_key is None) != (opts.concurrency_limit is None):
        raise ConfigurationError("concurrency_key and concurrency_limit go together "
                                 "(a task's default key is its name)")
    if opts.concurrency_limit is not None and (
        not isinstance(opts.concurrency_limit, int) or isinstance(opts.concurrency_limit, bool)
        or opts.concurrency_limit < 1
    ):
        raise ConfigurationError(
            f"concurrency_limit must be an int >= 1, got {opts.concurrency_limit!r}")
    if not (opts.rate_key is None) == (opts.rate_limit is None) == (opts.rate_period is None):
        raise ConfigurationError(
            "rate_key and rate_limit go together (a task's default key is its name)")
    if opts.on_parent_failure not in pending.ON_PARENT_FAILURE:
        raise ConfigurationError(
            "on_parent_failure must be 'cancel' (a parent that goes dead or is cancelled "
            "cancels the job) or 'run' (it runs once every parent has finished), got "
            f"{opts.on_parent_failure!r}")
    if not _finite(opts.wait_if_full) or opts.wait_if_full < 0:
        raise ConfigurationError(
            f"wait_if_full must be a non-negative number of seconds, got {opts.wait_if_full!r}")
    return opts


def _check_key(what: str, key: object) -> None:
    if key is None:
        return
    if not isinstance(key, str) or not 0 < len(key) <= UNIQUE_KEY_MAX:
        raise ConfigurationError(
            f"{what} must be a non-empty str of at most {UNIQUE_KEY_MAX} characters")
    payload.encode(key, what=what)


_RATE_RE = re.compile(
    r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*(s|sec|second|m|min|minute|h|hour|d|day)s?\s*$")
_UNIT_SECONDS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60,
                 "h": 3600, "hour": 3600, "d": 86400, "day": 86400}


def parse_rate(rate: str | tuple[int, float | dt.timedelta]) -> tuple[int, float]:
    """``"100/m"``, ``"5/10s"``, ``"1000/hour"`` or ``(100, 60.0)`` -> (claims, period in
    seconds)."""
    if isinstance(rate, tuple) and len(rate) == 2:
        n, period = rate[0], _to_seconds(rate[1])
    elif isinstance(rate, str) and (m := _RATE_RE.match(rate)):
        n, period = int(m.group(1)), float(m.group(2) or 1) * _UNIT_SECONDS[m.group(3)]
    else:
        raise ConfigurationError(
            f"rate_limit must look like '100/m', '5/10s' or (100, 60.0), got {rate!r}")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1 or not _finite(period) or period <= 0:
        raise ConfigurationError(
            f"rate_limit needs a count >= 1 and a period > 0 seconds, got {rate!r}")
    return n, float(period)


def _finite(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _to_seconds(value: float | dt.timedelta) -> float:
    return value.total_seconds() if isinstance(value, dt.timedelta) else value


def _to_timestamp(value: float | dt.datetime) -> float:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise ConfigurationError(
                f"run_at {value!r} has no timezone; pass an aware datetime "
                "(e.g. tzinfo=datetime.UTC)"
            )
        return value.timestamp()
    return value


# Celery's per-call options (apply_async) and Conveyor's options() for them; None: none.
_CELERY_OPTIONS = {"countdown": "delay", "eta": "run_at", "queue": "queue", "priority": "priority",
                   "expires": None, "retry": None, "retry_policy": None, "link": None,
                   "link_error": None, "serializer": None, "task_id": None}


def _celery_call(name: str, args: Sequence[Any], kwargs: Mapping[str, Any],
                 options: Mapping[str, Any]) -> str:
    """What ``name.apply_async(args, kwargs, **options)`` is written as here."""
    given = [f"{_CELERY_OPTIONS[k]}={'...' if k == 'eta' else repr(v)}" for k, v in options.items()
             if _CELERY_OPTIONS.get(k)]
    unsupported = [k for k in options if not _CELERY_OPTIONS.get(k)]
    call = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
    opts = f".options({', '.join(given)})" if given else ""
    text = f"{name}{opts}.enqueue({call})"
    return text + (f"; no equivalent for {', '.join(unsupported)}" if unsupported else "")


class _Enqueuer(Generic[P, R]):
    """What ``Task`` and ``task.options(...)`` share: turning calls into stored jobs."""

    task: Task[P, R]
    _opts: EnqueueOptions
    # (options, max_depth, NewJob constructor) of the last call without a trace: see _new_jobs.
    _kept_maker: tuple[EnqueueOptions, int | None, Callable[..., NewJob]] | None = None

    def _new_job(self, args: Sequence[Any], kwargs: Mapping[str, Any],
                 trace: dict[str, str] | None) -> NewJob:
        """``trace``: ``tracing.carrier()``, the same for every job of one call."""
        return self._new_jobs([(args, kwargs)], trace)[0]

    def _new_jobs(self, calls: Sequence[tuple[Sequence[Any], Mapping[str, Any]]],
                  trace: dict[str, str] | None,
                  pass_result: dict[str, Any] | None = None) -> list[NewJob]:
        """The calls' jobs. What every job of one call shares is worked out once, not per job
        (see docs/benchmarks.md, "Design measurements"), then each call is bound, checked and
        encoded. ``pass_result`` (a chain's): the first parameter is left unbound, to be filled
        with the parent's result when the job runs (see executor.fill_parent_result)."""
        task, app, o = self.task, self.task.app, self._opts
        meta: dict[str, Any] = {tracing.META_KEY: trace} if trace else {}
        if pass_result is not None:
            meta[payload.PASS_RESULT_KEY] = pass_result
        max_depth = app.max_depths.get(o.queue)
        # Without a trace, what the jobs share is the same call after call: the constructor is
        # kept, not made again for every one-by-one enqueue.
        kept = self._kept_maker
        if not meta and kept is not None and kept[0] is o and kept[1] == max_depth:
            make = kept[2]
        else:
            shared = {
                "task": task.name, "queue": o.queue, "max_attempts": o.max_attempts,
                "timeout": o.timeout, "priority": o.priority, "delay": o.delay,
                "run_at": o.run_at, "unique_key": o.unique_key,
                "meta": json.dumps(meta) if meta else "{}",
                "max_depth": max_depth, "unique_for": o.unique_for, "fair_key": o.fair_key,
                "concurrency_key": o.concurrency_key, "concurrency_limit": o.concurrency_limit,
                "rate_key": o.rate_key, "rate_limit": o.rate_limit, "rate_period": o.rate_period,
            }
            make = fast_constructor(NewJob, shared)
            if not meta:
                self._kept_maker = (o, max_depth, make)
        fn, name, sig, names = task.fn, task.name, task.signature, task.plain_parameters
        what, limit, signer = f"arguments of {name}", app.max_payload_bytes, app.signer
        open_param = payload.first_parameter(sig, name) if pass_result is not None else None
        new = []
        for args, kwargs in calls:
            try:
                if open_param is None:
                    bound = payload.bind_arguments(fn, args, kwargs, task_name=name, sig=sig,
                                                   names=names)
                else:
                    # Bound with a stand-in for the first parameter, which is then left out.
                    bound = payload.bind_arguments(fn, (None, *args), kwargs, task_name=name,
                                                   sig=sig, names=names)
                    del bound[open_param]
            except ArgumentsError as exc:
                celery = [k for k in kwargs if _CELERY_OPTIONS.get(k) and k not in sig.parameters]
                if celery:
                    hint = ", ".join(f"{_CELERY_OPTIONS[k]}=..." for k in celery)
                    raise ArgumentsError(
                        f"{exc}; {', '.join(celery)} is an option, not an argument: "
                        f"{task.__name__}.options({hint}).enqueue(...)") from None
                raise
            text = payload.encode(bound, what=what, limit=limit)
            if signer is None:
                new.append(make(args=text))
            else:
                signature = signer.sign(name, o.queue, bound)
                new.append(make(args=text, meta=json.dumps({**meta, signing.META_KEY: signature})))
        batch = pending.current()
        if o.after or batch is not None:
            after, refs = pending.resolve_after(o.after)
            batch_id = batch.id if batch is not None else None
            mode = cast(pending.ParentFailure, o.on_parent_failure)
            new = [replace(j, after=after, after_refs=refs, on_parent_failure=mode,
                           batch_id=batch_id) for j in new]
        return new

    def _jobs(self, new: Sequence[NewJob], connection: Any = None) -> list[Job]:
        return submit(self.task.app, new, connection=connection,
                      wait_if_full=self._opts.wait_if_full)

    def _split_connection(self, kwargs: dict[str, Any]) -> Any:
        # ``enqueue(..., connection=conn)`` unless the task itself has a ``connection`` parameter.
        if "connection" in kwargs and "connection" not in self.task.signature.parameters:
            return kwargs.pop("connection")
        return self._opts.connection

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Store one job durably and return it (with its id). Bad arguments raise and store nothing.

        On PostgreSQL, ``connection=conn`` (or ``.options(connection=conn)``) writes the job in
        that connection's transaction: it exists only if the caller commits.
        """
        connection = self._split_connection(kwargs)
        return self._jobs([self._new_job(args, kwargs, tracing.carrier())], connection)[0]

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """``enqueue`` for async code: the store write runs off the event loop.

        ``connection`` may be a psycopg ``AsyncConnection``: the job joins its transaction.
        """
        connection = self._split_connection(kwargs)
        new = [self._new_job(args, kwargs, tracing.carrier())]
        if connection is not None and _is_async_connection(connection):
            _refuse_in_batch(connection)
            store = _transactional(self.task.app.backend)
            try:
                results = await store.aenqueue_many(new, connection=connection)
            except QueueFull as exc:
                if self.task.app.metrics is not None:
                    self.task.app.metrics.refused.labels(exc.queue).inc()
                raise
            if results[0].created and not new[0].after:
                return built(self.task.app, new, results, None)[0]
            existing = await store.aget(results[0].id, connection=connection)
            if existing is None:
                raise JobNotFound(
                    f"job {results[0].id} holding unique key {new[0].unique_key!r} vanished")
            return bind(existing, self.task.app)
        return (await asyncio.to_thread(self._jobs, new, connection))[0]

    def enqueue_many(self, calls: Iterable[Sequence[Any] | Mapping[str, Any]]) -> list[Job]:
        """Store many jobs in one atomic write: each item is a tuple/list of args or a dict of
        kwargs.

        If any item is invalid, nothing is stored.
        """
        split: list[tuple[Sequence[Any], Mapping[str, Any]]] = []
        for i, call in enumerate(calls):
            if isinstance(call, Mapping):
                split.append(((), call))
            elif isinstance(call, list | tuple):
                split.append((call, {}))
            else:
                raise PayloadError(
                    f"enqueue_many item {i} is a {type(call).__name__}; "
                    "give a tuple of positional args or a dict of keyword args"
                )
        return self._jobs(self._new_jobs(split, tracing.carrier()), self._opts.connection)

    async def aenqueue_many(self, calls: Iterable[Sequence[Any] | Mapping[str, Any]]) -> list[Job]:
        """``enqueue_many`` for async code: the store write runs off the event loop."""
        return await asyncio.to_thread(self.enqueue_many, list(calls))

    def options(
        self, *, delay: float | dt.timedelta | None = None,
        run_at: float | dt.datetime | None = None, priority: int | None = None,
        queue: str | None = None, unique_key: str | None = None, max_attempts: int | None = None,
        timeout: float | None = None, connection: Any = None, wait_if_full: float | None = None,
        unique_for: float | dt.timedelta | None = None, fair_key: str | None = None,
        concurrency_key: str | None = None, concurrency_limit: int | None = None,
        rate_key: str | None = None, rate_limit: str | tuple[int, float] | None = None,
        after: Any = None, on_parent_failure: str | None = None,
    ) -> TaskCall[P, R]:
        """Per-call overrides: ``send_email.options(delay=10, priority=1).enqueue(42)``.

        ``unique_key``: while a job with this key is unfinished, enqueue returns it instead of
        making another; ``unique_for`` keeps the key taken that long after the job succeeds.
        ``fair_key`` (a tenant id): claims rotate across the fair keys waiting in the queue, so
        one tenant's backlog cannot starve another's. ``wait_if_full``: seconds to wait for room
        in a queue at its max_depth before raising QueueFull.
        ``concurrency_key``/``concurrency_limit``: at most that many running jobs with the key,
        across all workers (the task's own limit, if any, is keyed by its name).
        ``rate_key``/``rate_limit`` (``"100/m"``): at most that many starts per period with the key.
        Jobs over a limit wait, without using attempts.
        ``after=[job, ...]`` (Jobs, ids, or the handles enqueue returns inside an
        ``app.batch()`` block): the job is ``waiting`` until they have all finished (see
        docs/workflows.md); ``on_parent_failure="run"`` runs it even if one of them went dead
        or was cancelled (the default, ``"cancel"``, cancels it). Options add up:
        ``task.options(delay=5).options(after=[job])``.
        """
        changes: dict[str, Any] = {}
        if concurrency_limit is not None:
            changes["concurrency_limit"] = concurrency_limit
            changes["concurrency_key"] = (concurrency_key or self._opts.concurrency_key
                                          or self.task.name)
        elif concurrency_key is not None:
            changes["concurrency_key"] = concurrency_key
        if rate_limit is not None:
            changes["rate_limit"], changes["rate_period"] = parse_rate(rate_limit)
            changes["rate_key"] = rate_key or self._opts.rate_key or self.task.name
        elif rate_key is not None:
            changes["rate_key"] = rate_key
        if unique_for is not None:
            changes["unique_for"] = _to_seconds(unique_for)
        if delay is not None:
            changes["delay"] = _to_seconds(delay)
        if run_at is not None:
            changes["run_at"] = _to_timestamp(run_at)
        if after is not None:
            changes["after"] = pending.check_after(after)
        for key, value in (("on_parent_failure", on_parent_failure), ("priority", priority),
                           ("queue", queue), ("unique_key", unique_key),
                           ("max_attempts", max_attempts), ("timeout", timeout),
                           ("connection", connection), ("wait_if_full", wait_if_full),
                           ("fair_key", fair_key)):
            if value is not None:
                changes[key] = value
        return TaskCall(self.task, _check_options(replace(self._opts, **changes)))

    # Celery's names, so a ported call fails saying what to write instead of a bare AttributeError.
    def delay(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Celery's name: here it is ``enqueue(*args, **kwargs)``."""
        raise TypeError(f"Conveyor tasks have no .delay(): write "
                        f"{self.task.__name__}.enqueue(*args, **kwargs) "
                        f"(here {_celery_call(self.task.__name__, args, kwargs, {})})")

    def apply_async(self, args: Sequence[Any] | None = None,
                    kwargs: Mapping[str, Any] | None = None, **options: Any) -> NoReturn:
        """Celery's name: here it is
        ``options(delay=..., queue=..., priority=...).enqueue(...)``."""
        raise TypeError(f"Conveyor tasks have no .apply_async(): write "
                        f"{_celery_call(self.task.__name__, args or (), kwargs or {}, options)}")


class Task(_Enqueuer[P, R]):
    """A function registered with ``@app.task``. Calling it runs it here and now."""

    def __init__(
        self, app: Conveyor, fn: Callable[P, R], *, name: str, queue: str, max_attempts: int,
        timeout: float, priority: int, retry: RetryPolicy, concurrency_limit: int | None = None,
        rate_limit: str | tuple[int, float] | None = None,
        retry_on: ExceptionClasses | None = None, dead_on: ExceptionClasses = (),
    ) -> None:
        self.app = app
        self.fn = fn
        self.name = payload.check_task_name(name)
        self.retry_policy = retry
        # Which failures are retried (None: all) and which go dead at once: read by the
        # worker when an attempt fails (executor.Execution), never stored with the job.
        self.retry_on = retry_on
        self.dead_on = dead_on
        self.is_async = inspect.iscoroutinefunction(fn)
        self.signature = inspect.signature(fn)
        self.plain_parameters = payload.plain_parameters(self.signature)
        params = list(self.signature.parameters.values())
        # The common shape, plain positional-or-keyword parameters, gets a fast rebuild of its
        # stored arguments (see rebuild_call); anything else goes through payload.rebuild_call.
        self._plain = tuple(p.name for p in params) if all(
            p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params) else None
        self._required = sum(1 for p in params if p.default is inspect.Parameter.empty)
        self.task = self
        rate = parse_rate(rate_limit) if rate_limit is not None else None
        self._opts = _check_options(EnqueueOptions(
            queue=queue, max_attempts=max_attempts, timeout=timeout, priority=priority,
            concurrency_key=self.name if concurrency_limit is not None else None,
            concurrency_limit=concurrency_limit,
            rate_key=self.name if rate else None, rate_limit=rate[0] if rate else None,
            rate_period=rate[1] if rate else None,
        ))
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", name)
        self.__wrapped__ = fn

    @property
    def queue(self) -> str:
        """The queue its jobs go to unless ``options(queue=...)`` says otherwise."""
        return self._opts.queue

    @property
    def max_attempts(self) -> int:
        """Attempts a job of this task gets before it goes to the dead-letter queue."""
        return self._opts.max_attempts

    @property
    def timeout(self) -> float:
        """Seconds one attempt may run before it is stopped and counted as failed."""
        return self._opts.timeout

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """This task with these arguments, not enqueued yet: a step of ``app.chain``, a member
        of ``app.group``, a batch's callback (docs/workflows.md). ``.options(...)`` and
        ``.enqueue()`` work on it as on the task."""
        from .workflow import signature

        return signature(self, args, kwargs)

    def rebuild_call(self, stored: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Stored named arguments as ``(args, kwargs)`` for the function, as
        ``payload.rebuild_call`` makes them; raises ArgumentsError if they no longer fit.
        Stored arguments that are the first k plain parameters (k at least the required ones)
        are simply those values in order: no per-job ``Signature.bind``."""
        order = self._plain
        k = len(stored)
        if order is not None and self._required <= k <= len(order):
            try:
                return tuple([stored[name] for name in order[:k]]), {}
            except KeyError:
                pass  # not a prefix: the general rules decide
        return payload.rebuild_call(self.fn, stored, self.signature)

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.queue!r}>"


class TaskCall(_Enqueuer[P, R]):
    """A task with per-call options applied; made by ``Task.options``."""

    def __init__(self, task: Task[P, R], opts: EnqueueOptions) -> None:
        self.task = task
        self._opts = opts


def _refuse_in_batch(connection: Any) -> None:
    if connection is not None and pending.current() is not None:
        raise ConfigurationError(
            "enqueue with connection= inside an app.batch() block: the batch writes its jobs "
            "itself, in one write when the block ends")


def submit(app: Conveyor, new: Sequence[NewJob], *, connection: Any = None,
           wait_if_full: float = 0.0, batches: Sequence[NewBatch] = ()) -> list[Job]:
    """Write the jobs, or, inside an ``app.batch()`` block, add them to its write and return
    their pending handles (which stand in for Jobs until the block ends)."""
    batch = pending.current()
    if batch is None:
        return write_jobs(app, new, connection=connection, wait_if_full=wait_if_full,
                          batches=batches)
    _refuse_in_batch(connection)
    if batch.buffer.app is not app:
        raise ConfigurationError(
            "a job of another app enqueued inside an app.batch() block: a batch is written to "
            "one store")
    batch.buffer.batches.extend(batches)
    return cast(list[Job], batch.buffer.add(new))


def write_jobs(app: Conveyor, new: Sequence[NewJob], *, connection: Any = None,
               wait_if_full: float = 0.0, batches: Sequence[NewBatch] = ()) -> list[Job]:
    """One atomic write of the jobs (and batch records); the Jobs as stored."""
    backend = app.backend
    store = _transactional(backend) if connection is not None else None
    deadline = time.monotonic() + wait_if_full
    pause = 0.01
    while True:
        try:
            if store is not None:
                results = store.enqueue_many(new, connection=connection, batches=batches)
            elif batches:
                results = backend.enqueue_many(new, batches=batches)
            else:
                results = backend.enqueue_many(new)
            break
        except QueueFull as exc:
            # In a caller's transaction we must not wait: its locks would block the workers.
            if connection is not None or time.monotonic() + pause > deadline:
                if app.metrics is not None:
                    app.metrics.refused.labels(exc.queue).inc()
                raise
            time.sleep(pause)
            pause = min(pause * 2, 0.5)
    metrics = app.metrics
    if metrics is not None:
        for item, res in zip(new, results, strict=True):
            if res.created:
                metrics.enqueued.labels(item.queue, item.task).inc()
    return built(app, new, results, connection)


def built(app: Conveyor, new: Sequence[NewJob], results: Sequence[EnqueueResult],
          connection: Any) -> list[Job]:
    """The Jobs just written, made from what was written rather than read back.

    A bulk enqueue's jobs differ in little but their args: what they share goes into one
    constructor per kind of job, and every args text is parsed in one call rather than one per
    job (see docs/benchmarks.md, "Design measurements"). A job with parents is read back unless
    every parent is a job this write created (then it is ``waiting``): whether a parent had
    already finished is the store's to say."""
    created = [item.args for item, res in zip(new, results, strict=True) if res.created]
    # One by one: raw_decode, without json.loads' checks for whitespace around the value.
    if len(created) == 1:
        decoded = iter((_raw_decode(created[0])[0],))
    else:
        decoded = iter(json.loads(f"[{','.join(created)}]"))
    jobs = []
    backend = app.backend
    kind: tuple[Any, ...] = ()
    make: Callable[..., Job] = Job  # (the first job's kind replaces it)
    for item, res in zip(new, results, strict=True):
        if res.created:
            args = next(decoded)
        refs = item.after_refs
        if not res.created or item.after or (refs and not all(results[r].created for r in refs)):
            # Read it where it is visible: it may sit uncommitted in the caller's transaction.
            existing = (
                _transactional(backend).get(res.id, connection=connection)
                if connection is not None else backend.get(res.id)
            )
            if existing is None:
                raise JobNotFound(f"job {res.id} vanished as it was written"
                                  if res.created else
                                  f"job {res.id} holding unique key {item.unique_key!r} vanished")
            jobs.append(existing)
            continue
        # The jobs of one call are mostly of one kind: its constructor is looked up once for a
        # run of them, not once per job.
        if (k := _kind_of(item)) != kind:
            kind, make = k, _job_maker(k)
        run_at = item.run_at if item.run_at is not None else res.at + item.delay
        state = (JobState.WAITING if refs else
                 JobState.SCHEDULED if run_at > res.at else JobState.AVAILABLE)
        if not refs and item.batch_id is None and item.callback_of is None and item.meta == "{}":
            jobs.append(make(id=res.id, args=args, state=state, run_at=run_at,
                             created_at=res.at, uid=res.uid))
            continue
        extra: dict[str, Any] = {}
        if refs:
            extra["parents"] = tuple(sorted({results[r].id for r in refs}))
            extra["on_parent_failure"] = item.on_parent_failure
        if item.batch_id is not None:
            extra["batch_id"] = item.batch_id
        if item.callback_of is not None:
            extra["callback_of"] = item.callback_of
        if item.meta != "{}":
            extra["meta"] = payload.decode(item.meta)
        jobs.append(make(id=res.id, args=args, state=state, run_at=run_at, created_at=res.at,
                         uid=res.uid, **extra))
    for job in jobs:
        bind(job, app)  # so that job.wait() knows its store
    return jobs
