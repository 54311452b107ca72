"""The job model: states, the Job record a caller sees, and the error records kept per attempt."""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from enum import StrEnum
from typing import Any, TypeVar, cast

T = TypeVar("T")


class JobState(StrEnum):
    """Where a job is in its lifecycle. A ``str``: ``JobState.DEAD == "dead"``.

    ``scheduled`` → ``available`` → ``running`` → one of the final states ``succeeded``,
    ``dead`` or ``cancelled``; a failed attempt goes back to ``scheduled`` (or ``available``)
    while attempts remain. A job enqueued ``after=`` other jobs starts ``waiting`` until they
    finish.
    """

    WAITING = "waiting"
    """Enqueued with ``after=`` parents that have not all finished; becomes ``available`` (or
    ``scheduled``, if its ``run_at`` is still ahead) in the same store write as its last
    parent's success, or ``cancelled`` when a parent goes dead or is cancelled (unless it was
    enqueued with ``on_parent_failure="run"``)."""
    SCHEDULED = "scheduled"
    """Waiting for its ``run_at``: a delay, or a retry's backoff."""
    AVAILABLE = "available"
    """Due; the next free worker slot on its queue takes it."""
    RUNNING = "running"
    """Leased by one worker until ``lease_expires_at``, extended by heartbeat."""
    SUCCEEDED = "succeeded"
    """Done; ``result`` holds the task's return value. Kept for the app's ``result_ttl``."""
    DEAD = "dead"
    """Failed for good (the dead-letter queue): kept with every attempt's error until redriven
    or purged."""
    CANCELLED = "cancelled"
    """Cancelled before it finished; it will not run (again)."""

    @property
    def is_final(self) -> bool:
        """True for ``succeeded``, ``dead`` and ``cancelled``: nothing moves the job on by
        itself."""
        return self in FINAL_STATES


FINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED})
WAITING_STATES = frozenset({JobState.SCHEDULED, JobState.AVAILABLE})
UNFINISHED_STATES = frozenset(
    {JobState.WAITING, JobState.SCHEDULED, JobState.AVAILABLE, JobState.RUNNING}
)


@dataclass(frozen=True)
class Job:
    """A snapshot of one job as the store holds it. Times are unix seconds from the store's
    clock."""

    id: int
    """The store's id for the job, unique and never reused."""
    task: str
    """The registered task name (by default ``module.function``)."""
    queue: str
    """The queue it waits in."""
    args: dict[str, Any]
    """The arguments bound to the task's parameters by name, as stored (JSON)."""
    state: JobState
    """Where it is in its lifecycle."""
    attempts: int
    """Attempts started so far (a claim counts one; a release at shutdown gives it back, and so
    does a lease that ran out before the job started: see ``stalls``)."""
    max_attempts: int
    """After this many failed attempts the job goes ``dead``."""
    priority: int
    """Lower runs first within its queue (-32768 to 32767; default 0)."""
    run_at: float
    """When it is (or was) due."""
    timeout: float
    """Seconds one attempt may run before it is stopped and counted as failed."""
    created_at: float
    """When it was enqueued."""
    uid: str | None = None
    """32 hex digits (128 random bits) written with the job at enqueue: unlike ``id``, never
    the same for two jobs, even after a store lost data and handed out an id again (Redis
    without persistence, a restore from backup, a failover with replication lag). Kept
    through retries and redrive. Build keys for other systems from it (idempotency keys).
    None only for a job stored before Conveyor had uids (a migrated PostgreSQL or SQLite
    store's old rows, a Redis job written by an earlier version)."""
    attempted_at: float | None = None
    """When its latest attempt started."""
    finished_at: float | None = None
    """When it reached a final state."""
    result: Any = None
    """The task's return value (JSON), once ``succeeded``."""
    errors: list[dict[str, Any]] = field(default_factory=list)
    """One record per failed attempt, oldest first (the last 20): ``attempt``, ``at``, ``kind``,
    ``type``, ``message``, ``traceback``, ``worker_id``."""
    unique_key: str | None = None
    """The deduplication key given at enqueue, if any."""
    worker_id: str | None = None
    """The worker that ran (or runs) its latest attempt."""
    lease_token: str | None = field(default=None, repr=False)
    """The current lease's fencing token, while ``running`` (internal to workers)."""
    lease_expires_at: float | None = None
    """When the current lease runs out unless a heartbeat extends it."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Extra data Conveyor keeps with the job, such as the trace context (``meta["trace"]``)."""
    fair_key: str | None = None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    rate_key: str | None = None
    rate_limit: int | None = None
    rate_period: float | None = None
    # Exactly-once steps this job has recorded (JobContext.once): step name -> its result.
    steps: dict[str, Any] = field(default_factory=dict)
    parents: tuple[int, ...] = ()
    """The jobs it was enqueued ``after=`` (ascending ids); empty for a job without
    dependencies."""
    on_parent_failure: str = "cancel"
    """What a parent going dead or cancelled does to it while it is ``waiting``: ``cancel`` it
    (the default) or ``run`` it anyway once every parent has finished."""
    batch_id: str | None = None
    """The batch it is a member of (the innermost, for nested batches), if any."""
    callback_of: str | None = None
    """The batch whose ``on_success`` or ``on_complete`` callback this job is, if any."""
    stalls: int = 0
    """Leases that ran out before the job started (held in a dead worker's prefetch, or claimed
    by a reply that was lost): given back without counting an attempt, up to MAX_STALLS times."""

    @property
    def is_final(self) -> bool:
        """True once the job is ``succeeded``, ``dead`` or ``cancelled``."""
        return self.state.is_final

    @property
    def last_error(self) -> dict[str, Any] | None:
        """The latest failed attempt's error record, or None."""
        return self.errors[-1] if self.errors else None

    def wait(self, timeout: float | None = None, *,
             disable_sync_subtasks: bool = True) -> Job:
        """Block until the job is ``succeeded``, ``dead`` or ``cancelled`` and return it as it
        is then (its ``result``, ``state`` and ``errors``); this snapshot is not changed.
        ``timeout``: seconds (None: no limit); when they run out, raises ``WaitTimeout`` (a
        ``TimeoutError``) whose ``job`` is the job as last seen. The store wakes the wait
        when the job finishes (see docs, "Waiting for results"). Works on a Job returned by
        ``enqueue`` (and its variants) or ``app.get_job``.

        Inside a task it raises ``WaitInTask``: a task that waits holds its worker slot, and
        slots all waiting for jobs that need a slot deadlock the pool.
        ``disable_sync_subtasks=False`` (Celery's name) allows it anyway."""
        from .waiting import wait

        return wait(self, timeout, disable_sync_subtasks)

    async def wait_async(self, timeout: float | None = None, *,
                         disable_sync_subtasks: bool = True) -> Job:
        """``wait`` for async code: the event loop runs on while the store waits."""
        from .waiting import wait_async

        return await wait_async(self, timeout, disable_sync_subtasks)

    def __getstate__(self) -> dict[str, Any]:
        # The app a Job was bound to (conveyor.waiting.bind) stays behind: a pickled job is
        # the snapshot only.
        state = dict(self.__dict__)
        state.pop("_app", None)
        return state

    def run_at_datetime(self) -> dt.datetime:
        """``run_at`` as an aware UTC datetime."""
        return dt.datetime.fromtimestamp(self.run_at, tz=dt.UTC)


@functools.cache
def _layout(cls: Any) -> tuple[frozenset[str], dict[str, Any],
                               list[tuple[str, Callable[[], Any]]], frozenset[str]]:
    """A dataclass's field names, defaults, default factories and required fields, read once
    (``fields()`` is most of what building a constructor costs, and a single enqueue builds one)."""
    fs = fields(cls)
    return (
        frozenset(f.name for f in fs),
        {f.name: f.default for f in fs if f.default is not MISSING},
        [(f.name, f.default_factory) for f in fs if f.default_factory is not MISSING],
        frozenset(f.name for f in fs if f.default is MISSING and f.default_factory is MISSING),
    )


def fast_constructor(cls: type[T], shared: Mapping[str, Any] | None = None) -> Callable[..., T]:
    """``cls(**shared, **values)`` for a frozen dataclass on a hot path (a row or hash turned
    into a Job, a call turned into a NewJob). The generated ``__init__`` of a frozen dataclass
    sets each field through ``object.__setattr__``, a large share of turning a claimed Redis
    hash into a Job (docs/benchmarks.md, "Design measurements"). This fills the instance's
    ``__dict__`` at once, which is what that ``__init__`` ends up with. ``shared``: values
    every instance of a batch has (a bulk enqueue's jobs differ in little but their args),
    merged with the defaults once instead of passed again per instance. A call that misses a
    required field or names an unknown one goes to the real ``__init__``, which raises its
    usual TypeError."""
    names, defaults, all_factories, all_required = _layout(cast(Any, cls))
    shared = dict(shared or {})
    if not shared.keys() <= names:
        raise TypeError(f"{cls.__name__} has no field {sorted(shared.keys() - names)[0]!r}")
    base = {**defaults, **shared}
    factories = [(name, factory) for name, factory in all_factories if name not in shared]
    required = all_required - shared.keys()
    new = object.__new__

    def make(**values: Any) -> T:
        keys = values.keys()
        if not (keys >= required and keys <= names):
            return cls(**{**shared, **values})
        obj = new(cls)
        d = obj.__dict__
        d.update(base)
        for name, factory in factories:
            if name not in values:
                d[name] = factory()
        d.update(values)
        return obj

    make.__doc__ = f"``{cls.__name__}(**values)``, built as fast_constructor describes."
    return make


make_job: Callable[..., Job] = fast_constructor(Job)
