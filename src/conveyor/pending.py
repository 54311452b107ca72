"""The write an open ``app.batch()`` block holds back, and the handles its enqueues return.

Inside ``with app.batch(...)`` every enqueue (``task.enqueue``, ``enqueue_many``,
``app.chain``, a nested ``app.batch``) adds its jobs to one buffer, owned by the outermost
block, instead of writing them; that block writes them all, with the batch records, in one
``enqueue_many`` when it ends. The buffer is found through a context variable, so it follows
the code of the block (threads started inside it do not see it; ``asyncio.to_thread`` does).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .backends.base import NewBatch, NewJob
from .errors import ConfigurationError
from .job import Job

if TYPE_CHECKING:
    from .app import Conveyor


class PendingJob:
    """What an enqueue inside an ``app.batch()`` block returns: a job not written yet.

    Pass it in ``after=`` to make another job of the block wait for it. Once the block has
    written the batch, ``job`` (and ``id``, ``wait()``) is the stored job; before, or if the
    block raised and wrote nothing, reading them raises ConfigurationError."""

    __slots__ = ("_buffer", "_job", "position")

    def __init__(self, buffer: Buffer, position: int) -> None:
        self._buffer = buffer
        self.position = position  # in the batch's single write
        self._job: Job | None = None

    @property
    def written(self) -> bool:
        """True once the batch block has written the job."""
        return self._job is not None

    @property
    def job(self) -> Job:
        """The stored job, once the batch block has written it."""
        if self._job is None:
            why = ("its batch block raised, so nothing was written" if self._buffer.discarded
                   else "it is written when the batch block ends")
            raise ConfigurationError(f"this job is not in the store: {why}")
        return self._job

    @property
    def id(self) -> int:
        """The stored job's id, once the batch block has written it."""
        return self.job.id

    def wait(self, timeout: float | None = None, **kwargs: Any) -> Job:
        """``Job.wait`` on the stored job."""
        return self.job.wait(timeout, **kwargs)

    def __repr__(self) -> str:
        if self._job is not None:
            return f"<PendingJob written as job {self._job.id}>"
        return f"<PendingJob #{self.position} of an unwritten batch>"


@dataclass(eq=False)
class Buffer:
    """The outermost batch block's write: its jobs in order, the batch records, and a handle
    per job."""

    app: Conveyor
    jobs: list[NewJob] = field(default_factory=list)
    handles: list[PendingJob] = field(default_factory=list)
    batches: list[NewBatch] = field(default_factory=list)
    discarded: bool = False

    def add(self, new: Iterable[NewJob]) -> list[PendingJob]:
        added = []
        for job in new:
            handle = PendingJob(self, len(self.jobs))
            self.jobs.append(job)
            self.handles.append(handle)
            added.append(handle)
        return added

    def truncate(self, size: int, batches: int) -> None:
        """Forget what an inner block that raised had added."""
        for handle in self.handles[size:]:
            handle._buffer = _DISCARDED
        del self.jobs[size:], self.handles[size:], self.batches[batches:]


@dataclass(eq=False)
class OpenBatch:
    """One ``app.batch()`` block while it runs: its id, the buffer it adds to, and where in
    that buffer its own jobs start."""

    id: str
    buffer: Buffer
    start: int
    batches_start: int


_open: contextvars.ContextVar[OpenBatch | None] = contextvars.ContextVar(
    "conveyor_batch", default=None)


def current() -> OpenBatch | None:
    """The innermost open batch block of this context, if any."""
    return _open.get()


def enter(batch: OpenBatch) -> contextvars.Token[OpenBatch | None]:
    return _open.set(batch)


def leave(token: contextvars.Token[OpenBatch | None]) -> None:
    _open.reset(token)


_DISCARDED = Buffer.__new__(Buffer)
_DISCARDED.discarded = True

ParentFailure = Literal["cancel", "run"]
ON_PARENT_FAILURE = ("cancel", "run")


def check_after(after: object) -> tuple[int | PendingJob, ...]:
    """``after=`` as given (Jobs, ids, pending handles; one or a list) as ids and handles."""
    items = after if isinstance(after, list | tuple | set | frozenset) else (after,)
    out: list[int | PendingJob] = []
    for item in items:
        if isinstance(item, Job):
            out.append(item.id)
        elif isinstance(item, PendingJob):
            out.append(item._job.id if item._job is not None else item)
        elif isinstance(item, int) and not isinstance(item, bool) and item > 0:
            out.append(item)
        else:
            raise ConfigurationError(
                "after= takes jobs, job ids (ints) or the handles enqueue returns inside a "
                f"batch block, got {item!r}")
    return tuple(out)


def resolve_after(after: tuple[int | PendingJob, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``after`` as (ids of stored jobs, positions in the open batch's write)."""
    ids: list[int] = []
    refs: list[int] = []
    batch = current()
    for item in after:
        if isinstance(item, int):
            ids.append(item)
        elif item._job is not None:
            ids.append(item._job.id)
        elif batch is not None and item._buffer is batch.buffer:
            refs.append(item.position)
        else:
            raise ConfigurationError(
                "after= names a job of a batch block that has not written it (it raised, or "
                "the handle is used outside that block before its end)")
    return tuple(dict.fromkeys(ids)), tuple(dict.fromkeys(refs))
