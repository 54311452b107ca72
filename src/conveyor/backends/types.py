"""The values that cross the Backend seam: jobs to write, leases, errors, stats and pages."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ..job import Job

# Why an attempt failed, as stored in each error of a job's ``errors`` list. The strings are
# stored data (and the dashboard and CLI read them back): add a kind, never rename one.
ErrorKind = Literal[
    "exception",  # the task raised
    "timeout",  # the task ran past its timeout
    "rejected",  # the task raised Reject: dead at once
    "retry",  # the task raised Retry
    "unknown_task",  # no task of that name in the worker
    "bad_arguments",  # the stored arguments no longer fit the function
    "bad_signature",  # the job's signature did not verify (signing)
    "bad_result",  # the task's result cannot be stored (not JSON)
    "result_too_large",  # the task's or a step's result is over the size limit
    "lease_expired",  # written by the stores' reap, never by the worker
    "dead_on",  # the exception is in the task's dead_on: dead at once
    "not_in_retry_on",  # the task has a retry_on and the exception is not in it: dead at once
    "parent_failed",  # a job it was enqueued after= went dead or was cancelled: cancelled
]


@dataclass(frozen=True)
class NewJob:
    """A validated job ready to be written. ``args`` is already-encoded JSON text."""

    task: str
    queue: str
    args: str
    max_attempts: int
    timeout: float
    priority: int = 0
    delay: float = 0.0
    run_at: float | None = None  # absolute unix time; wins over delay
    unique_key: str | None = None
    meta: str = "{}"
    max_depth: int | None = None  # the queue's limit of waiting jobs; past it, QueueFull
    # Seconds after the job *succeeds* during which its unique_key still returns it (None: the
    # key is free as soon as the job finishes). Dead and cancelled jobs free the key at once.
    unique_for: float | None = None
    # Tenant for fair sharing inside the queue: claims rotate across keys with waiting jobs.
    fair_key: str | None = None
    # At most concurrency_limit running jobs with this key, across every queue and worker.
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    # At most rate_limit claims of jobs with this key in any window of rate_period seconds.
    rate_key: str | None = None
    rate_limit: int | None = None
    rate_period: float | None = None
    # Dependencies (workflows): the job starts ``waiting`` until these jobs have finished. ``after``
    # holds ids of jobs already in the store; ``after_refs`` positions of jobs earlier in the same
    # ``enqueue_many`` call (a chain written at once). A reference to a later position or to itself
    # is refused (a cycle), as is an id the store does not hold: UnknownParent, nothing written.
    after: tuple[int, ...] = ()
    after_refs: tuple[int, ...] = ()
    on_parent_failure: Literal["cancel", "run"] = "cancel"
    # The batch (NewBatch.id) this job is a member of, or whose callback it is.
    batch_id: str | None = None
    callback_of: str | None = None


@dataclass(frozen=True)
class NewBatch:
    """A batch written by ``enqueue_many(jobs, batches=[...])`` together with its jobs: its members
    are the jobs with ``batch_id == id``, its callbacks the jobs with ``callback_of == id`` (each
    enqueued ``after=`` every member, so it leaves ``waiting`` exactly once, with the last
    member's finish). ``parent_id``: the enclosing batch of a nested one, written in the same call
    or before it; the inner batch's members and callbacks count as members of the outer one."""

    id: str
    parent_id: str | None = None


@dataclass(frozen=True)
class BatchInfo:
    """A batch as ``Backend.get_batch`` reads it: counts over its members, nested batches'
    members and callbacks included, and its own callbacks' ids."""

    id: str
    created_at: float
    parent_id: str | None = None
    total: int = 0
    waiting: int = 0
    pending: int = 0  # scheduled, available or running
    succeeded: int = 0
    dead: int = 0
    cancelled: int = 0
    on_success: int | None = None  # the callback job's id
    on_complete: int | None = None

    @property
    def finished(self) -> int:
        return self.succeeded + self.dead + self.cancelled

    @property
    def is_finished(self) -> bool:
        """Every member has reached a final state (callbacks are not members)."""
        return self.finished == self.total


@dataclass(frozen=True)
class EnqueueResult:
    id: int
    created: bool  # False when unique_key matched an unfinished job, whose id is returned
    at: float  # the store's time of the write; a new job's created_at
    uid: str | None = None  # the new job's uid (see Job.uid); None when not created


@dataclass(frozen=True)
class CronState:
    """What the store keeps about one cron schedule (``Backend.cron_states``): its last tick
    taken (unix seconds; None only while the store has no record), the id of the job made for
    the latest tick that made one (None until one did), when it was disabled (None while
    enabled), and when it was last enabled again (ticks before that are skipped)."""

    name: str
    last_tick: float | None
    last_job_id: int | None = None
    disabled_at: float | None = None
    enabled_at: float | None = None

    @property
    def disabled(self) -> bool:
        return self.disabled_at is not None


@dataclass(frozen=True)
class Lease:
    job_id: int
    token: str


@dataclass(frozen=True)
class ErrorInfo:
    """One failed attempt, as stored in the job's ``errors`` list."""

    kind: ErrorKind
    message: str
    type: str = ""
    traceback: str = ""

    def as_dict(self, attempt: int, at: float, worker_id: str | None) -> dict[str, Any]:
        return {
            "attempt": attempt,
            "at": at,
            "kind": self.kind,
            "type": self.type,
            "message": self.message,
            "traceback": self.traceback,
            "worker_id": worker_id,
        }


@dataclass(frozen=True)
class ReapResult:
    requeued: list[int] = field(default_factory=list)
    dead: list[int] = field(default_factory=list)
    queues: dict[int, str] = field(default_factory=dict)  # each reaped job's queue

    @property
    def count(self) -> int:
        return len(self.requeued) + len(self.dead)


@dataclass(frozen=True)
class QueueStats:
    queue: str
    waiting: int = 0  # enqueued after= jobs that have not all finished; not depth
    scheduled: int = 0
    available: int = 0  # includes scheduled jobs whose run_at has passed: they are waiting too
    running: int = 0
    succeeded: int = 0
    dead: int = 0
    cancelled: int = 0
    oldest_available_age: float | None = None  # seconds the oldest waiting job has been due
    # Total leases that expired on this queue since the store was created.
    lease_expiries: int = 0
    # Running jobs whose lease has run out, not yet taken back by a reaper.
    expired_leases: int = 0
    # Paused (Backend.pause_queue): no worker claims its jobs; since when, unix seconds.
    paused: bool = False
    paused_since: float | None = None

    @property
    def depth(self) -> int:
        return self.available


@dataclass(frozen=True)
class WorkerInfo:
    id: str
    queues: list[str]
    concurrency: int
    host: str
    pid: int
    started_at: float
    last_seen: float
    running: int = 0
    # Slots held by a sync task's thread still running after its job was settled (timed out,
    # lease lost): threads cannot be killed, so the slot stays taken until the call returns.
    stuck: int = 0


@dataclass(frozen=True)
class Stats:
    now: float
    queues: list[QueueStats]
    workers: list[WorkerInfo]


@dataclass(frozen=True)
class Page:
    jobs: list[Job]
    next_cursor: int | None  # pass back as ``cursor`` for the next page; None at the end


# What ``ack_and_claim`` returns: for each ack whether its lease still held, and the jobs claimed.
ClaimReply = tuple[list[bool], list[Job]]
