"""Runs one claimed job and decides what becomes of it; the worker then writes that decision."""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import enum
import functools
import threading
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from . import payload
from .backends.base import Backend, ErrorInfo, ErrorKind, Lease, transactional
from .cron import tick_of
from .errors import (
    ArgumentsError,
    ConfigurationError,
    JobNotFound,
    PayloadError,
    Reject,
    ResultTooLarge,
    Retry,
)
from .hooks import JobHooks
from .job import Job, JobState
from .threads import CallTimedOut, TaskThreads, ThreadCall

if TYPE_CHECKING:
    from .hooks import HookEvent
    from .signing import Signer
    from .task import Task

T = TypeVar("T")

# What one failed attempt may store: every list of jobs reads these back, on every backend.
MAX_MESSAGE_CHARS = 2_000
MAX_TRACEBACK_CHARS = 16_000
MAX_TYPE_CHARS = 300


class OutcomeKind(enum.StrEnum):
    """What becomes of an attempt. A str enum: spans and logs show the same words as before."""

    SUCCEEDED = "succeeded"  # with result JSON: the worker acks it
    RETRY = "retry"  # after ``delay`` (the store makes it dead on the last attempt)
    DEAD = "dead"
    COMPLETED = "completed"  # the task committed its success through JobContext.transaction


@dataclass(frozen=True)
class Outcome:
    """An attempt's outcome: its kind, and the result (JSON) or the error that goes with it."""

    kind: OutcomeKind
    result: str | None = None
    error: ErrorInfo | None = None
    delay: float = 0.0


class JobContext:
    """What a running task may know about its own job, and its transactional completion."""

    def __init__(self, job: Job, backend: Backend | None = None,
                 max_result_bytes: int | None = None) -> None:
        self.job = job
        self._backend = backend
        self._max_result_bytes = max_result_bytes  # of a step's result
        self.completed = False  # set once transaction() committed the job's success
        self.result: Any = None  # the result that transaction() committed
        # Set before transaction() writes the job's success, cleared only if that fails: from
        # then on the job is (about to be) finished, and its lease no longer the worker's concern.
        self.completing = False
        self._stop = False  # a plain flag: set once, read by the task's thread (no Event per job)
        self._connection: Any = None  # the open transaction() connection, if any
        self._steps: dict[str, Any] = dict(job.steps)

    @property
    def cancelled(self) -> bool:
        """True once this attempt should stop: the job was cancelled, this worker lost its
        lease, or the worker is shutting down past its grace period. Async tasks are cancelled
        outright; a sync task cannot be, so it should check this in its loops and return."""
        return self._stop

    def cancel(self) -> None:
        """Tell this attempt to stop (sets ``cancelled``); the worker calls it, tasks need not."""
        self._stop = True

    @property
    def id(self) -> int:
        """The job's id."""
        return self.job.id

    @property
    def uid(self) -> str:
        """A key no other job has: the job's ``uid`` (32 hex digits, random), the same for
        every attempt of this job. Unlike ``id``, which a store that lost data (Redis without
        persistence, a restore from backup, a failover) hands out again, it never names two
        jobs. Build idempotency keys for other systems from it: ``f"{ctx.uid}:{step}"``. For
        a job stored before Conveyor had uids, its id and the time it was enqueued."""
        job = self.job
        return job.uid if job.uid is not None else f"{job.id}-{job.created_at!r}"

    @property
    def attempt(self) -> int:
        """This attempt's number: 1 for the first run, 2 for the first retry or redelivery."""
        return self.job.attempts

    @property
    def batch_id(self) -> str | None:
        """The batch this job is a member of (the innermost), or None."""
        return self.job.batch_id

    @property
    def callback_of(self) -> str | None:
        """For a batch's ``on_success``/``on_complete`` callback: that batch's id."""
        return self.job.callback_of

    def parent_results(self) -> dict[int, Any]:
        """``{parent id: result}`` for the jobs this one was enqueued ``after=`` (a chain's
        previous step, a batch's members for its callback), read from the store. A parent
        that did not succeed (with ``on_parent_failure="run"``) gives None. The store keeps a
        finished parent while any child is unfinished, so the results are there while this job
        runs; JobNotFound if one is gone all the same (deleted by hand)."""
        if self._backend is None:
            raise ConfigurationError("parent_results() needs the job's store: it runs inside a "
                                     "worker")
        return read_parent_results(self._backend, self.job)

    @property
    def cron_tick(self) -> dt.datetime | None:
        """For a job made by a cron schedule: the tick it was meant for, in the schedule's
        timezone."""
        return tick_of(self.job)

    def once(self, step: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` at most once per job *to completion*, and remember its
        result.

        The first attempt that finishes the step records ``(job id, step) -> result`` in the
        store, bound to the job's ``uid``; a later attempt of the same job (a retry, or a
        redelivery after a crash) gets the recorded result back without calling ``fn`` again.
        Never another job that took this id after the store lost data: its record is refused
        (JobNotFound) and that job runs the step itself. The result must be JSON.

        What it guarantees: a step that completed and was recorded never runs again for this
        job. What it cannot: an attempt that dies after ``fn`` did its effect but before the
        record was written runs it again; pass the job's uid and step to the other side as an
        idempotency key (``f"{ctx.uid}:{step}"``) where it accepts one. Inside
        ``transaction()`` on PostgreSQL, the record commits with the task's own writes, so
        database effects made through that connection happen exactly once. Cost: one store
        write per step.
        """
        if step in self._steps:
            return self._steps[step]  # type: ignore[no-any-return]
        self._check_step(step)
        result = fn(*args, **kwargs)
        return self._record(step, result)  # type: ignore[no-any-return]

    async def aonce(self, step: str, fn: Callable[..., Awaitable[T]], *args: Any,
                    **kwargs: Any) -> T:
        """``once`` for async code: ``await ctx.aonce("charge", charge_card, order_id)``."""
        if step in self._steps:
            return self._steps[step]  # type: ignore[no-any-return]
        self._check_step(step)
        result = await fn(*args, **kwargs)
        return await asyncio.to_thread(self._record, step, result)

    def _check_step(self, step: str) -> None:
        if not isinstance(step, str) or not payload.NAME_RE.fullmatch(step):
            raise ConfigurationError(
                f"step name must match {payload.NAME_RE.pattern}, got {step!r}")
        if self._backend is None:
            raise ConfigurationError("once() needs the job's store: it runs inside a worker")

    def _record(self, step: str, result: Any) -> Any:
        encoded = payload.encode_result(result, what=f"result of step {step!r} of {self.job.task}",
                                        limit=self._max_result_bytes)
        backend = self._backend
        assert backend is not None
        store = transactional(backend) if self._connection is not None else None
        if store is not None:  # inside transaction(): the record joins its transaction
            _, stored = store.record_step(
                self.job.id, step, encoded, uid=self.job.uid, connection=self._connection)
        else:
            _, stored = backend.record_step(self.job.id, step, encoded, uid=self.job.uid)
        # A concurrent attempt may have recorded first: the first record is the answer.
        value = payload.decode(stored) if stored is not None else None
        self._steps[step] = value
        return value

    @contextmanager
    def transaction(self, result: Any = None) -> Iterator[Any]:
        """A database connection whose transaction also completes this job (PostgreSQL).

        Write with it inside the block; leaving the block marks the job succeeded (with
        ``result``) in the same transaction and commits both, so the writes happen exactly
        once: if this worker lost its lease meanwhile, the ack is refused, everything is
        rolled back and ``LeaseLost`` is raised. An exception in the block rolls back too.
        """
        backend = self._backend
        store = transactional(backend)
        if store is None:
            raise ConfigurationError(
                "transactional completion needs the PostgreSQL backend; "
                f"this job runs on {type(backend).__name__}"
            )
        if self.completed:
            raise ConfigurationError(
                "this job was already completed by an earlier transaction() block")
        token = self.job.lease_token
        assert token is not None
        encoded = payload.encode_result(result, what=f"result of {self.job.task}",
                                        limit=self._max_result_bytes)
        with store.completion_connection() as conn:
            self._connection = conn
            before = dict(self._steps)
            try:
                yield conn
                self.completing = True
                store.ack(Lease(self.job.id, token), encoded, connection=conn)
                conn.commit()
                self.completed = True
                self.result = result  # what job_succeeded hooks are told
            except BaseException:
                self.completing = False
                self._steps = before  # steps recorded in the rolled-back transaction did not happen
                raise
            finally:
                self._connection = None


def read_parent_results(backend: Backend, job: Job) -> dict[int, Any]:
    """``{parent id: result}`` of ``job``'s parents, in ascending ids (the order a chain or a
    group wrote them)."""
    out: dict[int, Any] = {}
    for parent_id in job.parents:
        parent = backend.get(parent_id)
        if parent is None:
            raise JobNotFound(f"parent job {parent_id} of job {job.id} is no longer stored, "
                              "so its result cannot be read")
        out[parent_id] = parent.result if parent.state is JobState.SUCCEEDED else None
    return out


_current: contextvars.ContextVar[JobContext | None] = contextvars.ContextVar(
    "conveyor_job", default=None)


def current_job() -> JobContext | None:
    """The job being run by the calling task, or None outside a worker."""
    return _current.get()


def _clip(text: str, limit: int, *, keep_end: bool = False) -> str:
    """At most ``limit`` characters of ``text``, saying how many were cut. ``keep_end``: cut
    from the middle, keeping the last three quarters (a traceback's exception is at its end)."""
    if len(text) <= limit:
        return text
    room = limit - 40  # for the note
    cut = len(text) - room
    if not keep_end:
        return f"{text[:room]}… [{cut:,} characters cut]"
    head = room // 4
    return f"{text[:head]}\n… [{cut:,} characters cut] …\n{text[len(text) - (room - head):]}"


def bounded(error: ErrorInfo) -> ErrorInfo:
    """The error as stored: message, type and traceback clipped to their limits."""
    if (len(error.message) <= MAX_MESSAGE_CHARS and len(error.traceback) <= MAX_TRACEBACK_CHARS
            and len(error.type) <= MAX_TYPE_CHARS):
        return error
    return replace(error, message=_clip(error.message, MAX_MESSAGE_CHARS),
                   type=_clip(error.type, MAX_TYPE_CHARS),
                   traceback=_clip(error.traceback, MAX_TRACEBACK_CHARS, keep_end=True))


def error_from(exc: BaseException, kind: ErrorKind = "exception") -> ErrorInfo:
    cls = type(exc)
    name = (cls.__qualname__ if cls.__module__ == "builtins"
            else f"{cls.__module__}.{cls.__qualname__}")
    tb = "".join(traceback.format_exception(exc))
    return bounded(ErrorInfo(kind=kind, type=name, message=str(exc), traceback=tb))


def failed(task: Task[Any, Any], cls: type[BaseException], error: ErrorInfo,
           attempt: int) -> Outcome:
    """The outcome of an attempt that failed with ``cls``: retried after the task's backoff
    (the store makes it dead on the last attempt), unless the task's ``dead_on`` lists it or
    its ``retry_on`` does not, as Celery's autoretry_for/dont_autoretry_for and Dramatiq's
    retry_when decide. Then it is dead at once, and its error's kind and message say why."""
    if any(issubclass(cls, c) for c in task.dead_on):
        kind: ErrorKind = "dead_on"
        why = f"{cls.__name__} is in dead_on ({_names(task.dead_on)})"
    elif task.retry_on is not None and not any(issubclass(cls, c) for c in task.retry_on):
        kind = "not_in_retry_on"
        why = f"{cls.__name__} is not in retry_on ({_names(task.retry_on)})"
    else:
        return Outcome(OutcomeKind.RETRY, error=error, delay=task.retry_policy.delay(attempt))
    note = f" [not retried: {why}]"
    # The note survives the clipping of a long message: it is what the reader looks for.
    message = _clip(error.message, max(MAX_MESSAGE_CHARS - len(note), 100)) + note
    return Outcome(OutcomeKind.DEAD, error=replace(error, kind=kind, message=message))


def _names(classes: tuple[type[BaseException], ...]) -> str:
    return ", ".join(c.__name__ for c in classes)


class TaskExit(Exception):
    """A task called ``sys.exit()``: that fails its job, never the worker."""


def _guard_sync(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except SystemExit as exc:
        raise TaskExit(f"task raised SystemExit({exc.code!r}) (sys.exit)") from None


async def _guard_async(coro: Coroutine[Any, Any, Any]) -> Any:
    # asyncio re-raises SystemExit out of the event loop itself; turn it into a failure here.
    try:
        return await coro
    except SystemExit as exc:
        raise TaskExit(f"task raised SystemExit({exc.code!r}) (sys.exit)") from None


class Execution:
    """One attempt of one job. ``thread`` is set for sync tasks: it may outlive a timeout.

    With job hooks (``hooks``), the task is wrapped: job_started before it and the outcome's
    event after it, on its own thread (a sync task) or in its asyncio task (an async one), in
    the task's context, so ``current_job()`` and thread-local state are the task's."""

    def __init__(
        self, job: Job, tasks: Mapping[str, Task[Any, Any]], pool: TaskThreads,
        backend: Backend | None = None, signer: Signer | None = None,
        context: contextvars.Context | None = None, max_result_bytes: int | None = None,
        hooks: JobHooks | None = None,
    ) -> None:
        self.job = job
        self.max_result_bytes = max_result_bytes
        self.signer = signer
        self.backend = backend
        self.tasks = tasks
        self.pool = pool
        self.hooks = hooks
        self.thread: ThreadCall | None = None
        self.context: JobContext | None = None
        self._base = context  # the context the task runs in a copy of (default: the caller's)
        self._prepared = False
        self._early: Outcome | None = None  # the outcome decided before the task could start
        self._task: Task[Any, Any] | None = None
        self._call: tuple[tuple[Any, ...], dict[str, Any], contextvars.Context] | None = None
        self._returned: Any = None  # what the task returned (job_succeeded's result)
        # The outcome, once decided: by the task's thread when the task returns, or by the
        # loop when it stops waiting for that thread (a timeout, a cancel). Whichever is first
        # stands, so a sync task's after-hooks report what the worker writes.
        self._decided: Outcome | None = None

    def prepare(self, *, here: bool = False) -> None:
        """Everything of the attempt up to the task's start, callable from any thread; a sync
        task is handed to its thread here. The worker calls it on the thread its claim came
        back on, so the job starts without waiting for the event loop to take the claim's reply
        (a thread hop that an idle worker's every job would pay). ``here``: called on one of
        the pool's threads, run the task on that thread next (TaskThreads.submit)."""
        self._prepared = True
        self._early = self._check()
        if self._early is not None:
            return
        task = self._task
        assert task is not None and self._call is not None
        ctx = self._call[2]
        if not task.is_async:
            # Its timeout counts from here: the thread's future fails when it runs out.
            self.thread = self.pool.submit(functools.partial(ctx.run, self._sync_attempt),
                                           timeout=self.job.timeout, here=here)

    @property
    def on_thread(self) -> bool:
        """Prepared, and its sync task handed to its thread: ``thread_outcome`` answers what
        ``run`` would, once the thread's future is done, without a coroutine to await it."""
        return self._prepared and self._early is None and self.thread is not None

    def thread_outcome(self) -> Outcome:
        """``run``'s outcome for an attempt ``on_thread`` whose thread's future is done (raises
        what awaiting ``run`` would raise)."""
        thread, context = self.thread, self.context
        assert thread is not None and context is not None
        try:
            outcome: Outcome = thread.future.result()
        except CallTimedOut as exc:  # as in _run: its thread runs on, the worker stops waiting
            context.cancel()
            outcome = self._decide(self._failure(exc))
        return self._finish(outcome)

    def dropped(self) -> None:
        """The worker stopped waiting for this attempt (``run`` cancelled): its thread, if it
        returns, reports nothing."""
        self._decide(_CANCELLED)

    async def run(self) -> Outcome:
        if not self._prepared:
            self.prepare()
        try:
            if self._early is not None:
                outcome = self._finish(self._early)
                if self.hooks is not None:  # dead before it started: no job_started
                    event = self._after_event(outcome)
                    if event is not None:
                        loop = self.hooks.loop
                        await self.pool.submit(functools.partial(
                            self.hooks.hooks.run_on_thread, event, loop)).future
            else:
                outcome = await self._run()
        except asyncio.CancelledError:
            self.dropped()
            raise
        return self._finish(outcome)

    def _check(self) -> Outcome | None:
        """Sets up the call; returns the job's outcome instead if it must not run at all."""
        job = self.job
        if self.signer is not None:
            # Checked before the task is looked up or anything of the job is used.
            problem = self.signer.problem(job.task, job.queue, job.args, job.meta)
            if problem is not None:
                return Outcome(OutcomeKind.DEAD, error=ErrorInfo(
                    kind="bad_signature", type="conveyor.errors.SignatureInvalid", message=problem))
        task = self.tasks.get(job.task)
        if task is None:
            return Outcome(OutcomeKind.DEAD, error=ErrorInfo(
                kind="unknown_task", type="conveyor.errors.UnknownTask",
                message=f"no task named {job.task!r} is registered in this worker; "
                        "deploy the code that defines it, then redrive the job",
            ))
        stored: object = job.args  # written by another process or version: check, don't trust
        if not isinstance(stored, dict):
            return Outcome(OutcomeKind.DEAD, error=ErrorInfo(
                kind="bad_arguments", type="conveyor.errors.ArgumentsError",
                message=f"stored arguments are a {type(stored).__name__}, not an object",
            ))
        try:
            if payload.PASS_RESULT_KEY in job.meta:
                stored = self._with_parent_result(task, stored)
            args, kwargs = task.rebuild_call(stored)
        except ArgumentsError as exc:
            return Outcome(OutcomeKind.DEAD, error=error_from(exc, "bad_arguments"))
        ctx = self._base.copy() if self._base is not None else contextvars.copy_context()
        self.context = JobContext(job, self.backend, self.max_result_bytes)
        ctx.run(_current.set, self.context)
        self._task, self._call = task, (args, kwargs, ctx)
        return None

    def _with_parent_result(self, task: Task[Any, Any],
                            stored: dict[str, Any]) -> dict[str, Any]:
        """A chain step's stored arguments with the first parameter, left open at enqueue
        (``pass_result=True``), filled with its parent's result: the list of them, in the
        order the parents were written, after a group."""
        job = self.job
        spec = job.meta[payload.PASS_RESULT_KEY]
        try:
            name = payload.first_parameter(task.signature, task.name)
        except ConfigurationError as exc:
            raise ArgumentsError(str(exc)) from None
        if name in stored:
            raise ArgumentsError(f"the stored arguments already give {name!r}, which the "
                                 "previous step's result was to fill")
        if self.backend is None or not job.parents:
            raise ArgumentsError("the job takes its parent's result, but has no parent to read")
        try:
            results = list(read_parent_results(self.backend, job).values())
        except JobNotFound as exc:
            raise ArgumentsError(str(exc)) from None
        many = isinstance(spec, dict) and spec.get("many")
        return {name: results if many else results[-1], **stored}

    async def _run(self) -> Outcome:
        assert self._task is not None and self._call is not None
        if self._task.is_async:
            ctx = self._call[2]
            return await asyncio.get_running_loop().create_task(self._async_attempt(),
                                                                context=ctx)
        thread = self.thread
        assert thread is not None and self.context is not None
        try:
            return await thread.future  # type: ignore[no-any-return]
        except CallTimedOut as exc:  # its thread runs on: the worker stops waiting for it
            self.context.cancel()  # a sync task that checks current_job().cancelled stops now
            return self._decide(self._failure(exc))

    # -- the attempt itself, in the task's context ----------------------------------------
    def _sync_attempt(self) -> Outcome:
        """On the task's thread: the task between its hooks."""
        task, hooks = self._task, self.hooks
        assert task is not None and self._call is not None
        args, kwargs, _ = self._call
        if hooks is not None:
            hooks.hooks.run_on_thread(hooks.event("job_started", self.job), hooks.loop)
        try:
            result = _guard_sync(functools.partial(task.fn, *args, **kwargs))
        except Exception as exc:
            outcome = self._failure(exc)
        else:
            outcome = self._success(result)
        outcome = self._finish(outcome)
        if hooks is not None:
            outcome = self._decide(outcome)
            event = self._after_event(outcome)
            if event is not None:
                hooks.hooks.run_on_thread(event, hooks.loop)
        return outcome

    async def _async_attempt(self) -> Outcome:
        """In the task's own asyncio task: the task between its hooks."""
        job, task, hooks = self.job, self._task, self.hooks
        assert task is not None and self._call is not None
        args, kwargs, _ = self._call
        if hooks is not None:
            await hooks.hooks.run_on_loop(hooks.event("job_started", job))
        deadline: asyncio.Timeout | None = None
        try:
            async with asyncio.timeout(job.timeout) as deadline:
                result = await _guard_async(task.fn(*args, **kwargs))
        except Exception as exc:
            outcome = self._failure(exc, deadline)
        else:
            outcome = self._success(result)
        outcome = self._finish(outcome)
        if hooks is not None:
            event = self._after_event(outcome)
            if event is not None:
                await hooks.hooks.run_on_loop(event)
        return outcome

    def _failure(self, exc: Exception, deadline: asyncio.Timeout | None = None) -> Outcome:
        """The outcome of an attempt whose task raised ``exc`` (or timed out: CallTimedOut)."""
        job, task, context = self.job, self._task, self.context
        assert task is not None and context is not None
        if isinstance(exc, Retry):
            delay = exc.delay if exc.delay is not None else task.retry_policy.delay(job.attempts)
            return Outcome(OutcomeKind.RETRY, error=error_from(exc, "retry"), delay=delay)
        if isinstance(exc, Reject):
            return Outcome(OutcomeKind.DEAD, error=error_from(exc, "rejected"))
        if isinstance(exc, CallTimedOut) or (isinstance(exc, TimeoutError) and deadline
                                             is not None and deadline.expired()):
            context.cancel()  # a sync task that checks current_job().cancelled stops now
            left = self.thread is not None and not self.thread.done()
            timeout = ErrorInfo(
                kind="timeout", type="TimeoutError",
                message=f"task {job.task} did not finish within its timeout of "
                        f"{job.timeout:g}s" + ("; its thread was left running" if left else ""),
            )
            # To the filters a timeout is a TimeoutError: its stored type says so too.
            return failed(task, TimeoutError, timeout, job.attempts)
        if isinstance(exc, ResultTooLarge):  # from ctx.once(): the step would return as much
            return Outcome(OutcomeKind.DEAD, error=error_from(exc, "result_too_large"))
        return failed(task, type(exc), error_from(exc), job.attempts)

    def _success(self, result: Any) -> Outcome:
        """The outcome of an attempt whose task returned ``result``."""
        self._returned = result
        if result is None:
            return _SUCCEEDED_NONE
        try:
            encoded = payload.encode_result(
                result, what=f"result of {self.job.task}", limit=self.max_result_bytes)
        except ResultTooLarge as exc:
            # Dead, not retried: it would return as much again. No traceback: it is ours.
            return Outcome(OutcomeKind.DEAD, error=ErrorInfo(
                kind="result_too_large", type="conveyor.errors.ResultTooLarge", message=str(exc)))
        except PayloadError as exc:
            # Running it again would produce the same unstorable result.
            return Outcome(OutcomeKind.DEAD, error=error_from(exc, "bad_result"))
        return Outcome(OutcomeKind.SUCCEEDED, result=encoded)

    def _finish(self, outcome: Outcome) -> Outcome:
        if outcome.error is not None:
            outcome = replace(outcome, error=bounded(outcome.error))
        if self.context is not None and self.context.completed:
            # Whatever happened after the transaction committed, the job is done.
            outcome = Outcome(OutcomeKind.COMPLETED)
        return outcome

    def _decide(self, outcome: Outcome) -> Outcome:
        """The attempt's outcome: ``outcome``, unless another was decided first."""
        with _decide_lock:
            if self._decided is None:
                self._decided = outcome
            return self._decided

    def _after_event(self, outcome: Outcome) -> HookEvent | None:
        """The hook event that ``outcome`` makes (None: the worker dropped the attempt)."""
        hooks, job = self.hooks, self.job
        assert hooks is not None
        kind = outcome.kind
        if outcome is _CANCELLED:
            return None
        if kind is OutcomeKind.SUCCEEDED or kind is OutcomeKind.COMPLETED:
            result = (self.context.result if kind is OutcomeKind.COMPLETED
                      and self.context is not None else self._returned)
            return hooks.event("job_succeeded", job, result=result)
        # A retry on the last attempt is made dead by the store, by the same rule.
        last = kind is OutcomeKind.DEAD or job.attempts >= job.max_attempts
        return hooks.event("job_dead" if last else "job_failed", job, error=outcome.error)


# The outcome of every task that returned None (most do): one instance, not one per job.
_SUCCEEDED_NONE = Outcome(OutcomeKind.SUCCEEDED, result="null")
_decide_lock = threading.Lock()
# Decided when the worker cancelled the attempt (lost lease, job cancelled, hurried shutdown).
_CANCELLED = Outcome(OutcomeKind.DEAD)
