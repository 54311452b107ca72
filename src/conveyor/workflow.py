"""Workflows above the store: signatures, chains, groups and batches (docs/workflows.md).

Everything here turns into one ``enqueue_many`` call: a chain's steps refer to each other by
position (``after_refs``), a batch adds its records (``NewBatch``) and callbacks to the same
write. The store does the rest (backends/base.py, "Dependencies")."""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any

from . import pending, tracing
from .backends.base import NewBatch, NewJob
from .errors import ConfigurationError
from .job import Job
from .task import EnqueueOptions, TaskCall, submit

if TYPE_CHECKING:
    from .app import Conveyor
    from .task import Task


@dataclass(frozen=True)
class Signature:
    """A task with its arguments and options, not enqueued yet: ``add.s(1, 2)``. Steps of
    ``app.chain``, members of ``app.group`` and a batch's callbacks are signatures."""

    task: Task[Any, Any]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    opts: EnqueueOptions | None = None  # None: the task's own

    def options(self, **options: Any) -> Signature:
        """The same call with per-call options, as ``task.options(...)`` takes them."""
        return replace(self, opts=self._call().options(**options)._opts)

    def _call(self) -> TaskCall[Any, Any]:
        return TaskCall(self.task, self.opts if self.opts is not None else self.task._opts)

    def enqueue(self) -> Job:
        """Enqueue it on its own: ``task.options(...).enqueue(*args, **kwargs)``."""
        return self._call().enqueue(*self.args, **self.kwargs)

    def __repr__(self) -> str:
        call = ", ".join([*map(repr, self.args), *(f"{k}={v!r}" for k, v in self.kwargs.items())])
        return f"{self.task.name}.s({call})"


def signature(task: Task[Any, Any], args: tuple[Any, ...],
              kwargs: Mapping[str, Any]) -> Signature:
    return Signature(task, tuple(args), MappingProxyType(dict(kwargs)))


@dataclass(frozen=True)
class Group:
    """Signatures that run side by side: a step of ``app.chain`` whose successor waits for all
    of them (and, with ``pass_result``, gets the list of their results, in order)."""

    signatures: tuple[Signature, ...]

    def __post_init__(self) -> None:
        if not self.signatures:
            raise ConfigurationError("app.group() needs at least one signature")
        for sig in self.signatures:
            if not isinstance(sig, Signature):
                raise ConfigurationError(
                    f"app.group() takes signatures (task.s(...)), got {sig!r}")


Step = Signature | Group


def chain(app: Conveyor, steps: Sequence[Step], *, pass_result: bool = False) -> list[Job]:
    """``app.chain``: each step waits for the one before it; one write."""
    if not steps:
        raise ConfigurationError("app.chain() needs at least one step")
    batch = pending.current()
    base = len(batch.buffer.jobs) if batch is not None else 0
    trace = tracing.carrier()
    new: list[NewJob] = []
    previous: list[int] = []  # positions, in this write, of the step before
    previous_is_group = False
    for i, step in enumerate(steps):
        if isinstance(step, Signature):
            sigs: tuple[Signature, ...] = (step,)
        elif isinstance(step, Group):
            sigs = step.signatures
        else:
            raise ConfigurationError(
                f"app.chain() takes signatures (task.s(...)) and app.group(...), got {step!r}")
        positions = []
        for sig in sigs:
            if sig.task.app is not app:
                raise ConfigurationError(
                    f"{sig!r} is a task of another app: a chain is written to one store")
            call = sig._call()
            passes = pass_result and i > 0
            if passes and call._opts.after:
                raise ConfigurationError(
                    f"{sig!r} has after= in a chain with pass_result=True: a step that takes "
                    "the previous result has the previous step as its only parent")
            [job] = call._new_jobs([(sig.args, sig.kwargs)], trace,
                                   {"many": previous_is_group} if passes else None)
            if i > 0:
                refs = (*job.after_refs, *(base + p for p in previous))
                job = replace(job, after_refs=tuple(sorted(set(refs))))
            positions.append(len(new))
            new.append(job)
        previous, previous_is_group = positions, isinstance(step, Group)
    return submit(app, new)


class Batch:
    """``with app.batch(on_success=..., on_complete=...) as b:`` (see docs/workflows.md).

    Every enqueue in the block is held back and written with the batch record and its
    callbacks in one ``enqueue_many`` at the block's end; an exception in the block writes
    nothing. A batch opened inside another one is part of it: the outermost block writes
    everything. ``id`` is known from the start; ``jobs`` (the members, in the order enqueued)
    and ``on_success_job``/``on_complete_job`` once the block has written them."""

    def __init__(self, app: Conveyor, on_success: Signature | None = None,
                 on_complete: Signature | None = None) -> None:
        for what, sig in (("on_success", on_success), ("on_complete", on_complete)):
            if sig is not None and not isinstance(sig, Signature):
                raise ConfigurationError(f"{what} takes a signature (task.s(...)), got {sig!r}")
            if sig is not None and sig.task.app is not app:
                raise ConfigurationError(f"{what}: {sig!r} is a task of another app")
        self.app = app
        self.id = secrets.token_hex(16)
        self.on_success = on_success
        self.on_complete = on_complete
        self._open: pending.OpenBatch | None = None
        self._token: Any = None
        self._members: list[pending.PendingJob] = []
        self._callbacks: dict[str, pending.PendingJob] = {}
        self._written = False

    def __enter__(self) -> Batch:
        if self._open is not None or self._written:
            raise ConfigurationError("a batch block can be entered once")
        outer = pending.current()
        if outer is not None and outer.buffer.app is not self.app:
            raise ConfigurationError("a batch of another app inside an app.batch() block")
        buffer = outer.buffer if outer is not None else pending.Buffer(self.app)
        self._outer = outer
        self._open = pending.OpenBatch(self.id, buffer, len(buffer.jobs), len(buffer.batches))
        buffer.batches.append(NewBatch(self.id, outer.id if outer is not None else None))
        self._token = pending.enter(self._open)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        opened = self._open
        assert opened is not None
        pending.leave(self._token)
        buffer = opened.buffer
        if exc_type is not None:
            if self._outer is None:
                buffer.discarded = True
                buffer.truncate(0, 0)
            else:
                buffer.truncate(opened.start, opened.batches_start)
            return
        self._members = buffer.handles[opened.start:]
        members = tuple(range(opened.start, len(buffer.jobs)))
        callbacks: list[NewJob] = []
        names = []
        for name, sig, mode in (("on_success", self.on_success, "cancel"),
                                ("on_complete", self.on_complete, "run")):
            if sig is not None:
                callbacks.append(self._callback(sig, members, mode))
                names.append(name)
        # A nested batch's callbacks are members of the batch around it.
        self._callbacks = dict(zip(names, buffer.add(callbacks), strict=True))
        if self._outer is None:
            self._write(buffer)

    def _callback(self, sig: Signature, members: tuple[int, ...], mode: str) -> NewJob:
        call = sig._call()
        kwargs = dict(sig.kwargs)
        if "batch_id" in sig.task.signature.parameters and "batch_id" not in kwargs:
            kwargs["batch_id"] = self.id
        # Built once the block is left: a member of the batch around it, if any, not of this one.
        [job] = call._new_jobs([(sig.args, kwargs)], tracing.carrier())
        refs = tuple(sorted({*job.after_refs, *members}))
        return replace(job, after_refs=refs, callback_of=self.id,
                       on_parent_failure="cancel" if mode == "cancel" else "run")

    def _write(self, buffer: pending.Buffer) -> None:
        if not buffer.jobs:
            self._written = True
            return  # nothing to write: an empty batch without callbacks leaves no record
        jobs = submit(self.app, buffer.jobs, batches=buffer.batches)
        for handle, job in zip(buffer.handles, jobs, strict=True):
            handle._job = job
        self._written = True

    @property
    def jobs(self) -> list[Job]:
        """The members (a nested batch's jobs and callbacks included), once written."""
        return [h.job for h in self._members]

    @property
    def on_success_job(self) -> Job | None:
        """The ``on_success`` callback's job, once written (None without one)."""
        handle = self._callbacks.get("on_success")
        return handle.job if handle is not None else None

    @property
    def on_complete_job(self) -> Job | None:
        """The ``on_complete`` callback's job, once written (None without one)."""
        handle = self._callbacks.get("on_complete")
        return handle.job if handle is not None else None

    def __repr__(self) -> str:
        return f"<Batch {self.id}>"
