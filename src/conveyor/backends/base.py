"""The contract between Conveyor and a store. The worker, CLI and dashboard know only this.

Rules every backend keeps (the conformance suite in tests/conformance checks them):

* Each method that changes a job is one atomic operation in the store (one transaction,
  one script). Nothing is half-written when it raises.
* Times come from the store's clock. Every time-dependent method takes ``now`` (unix
  seconds); production passes ``None`` and the store's clock is used, tests pass a value.
* Every call after ``claim`` carries a :class:`Lease` (job id + token). If the token no
  longer matches the job's current lease, the call changes nothing and raises
  :class:`~conveyor.errors.LeaseLost` (``heartbeat`` reports lost ids instead).
* ``claim`` never hands out more jobs than asked for (the worker asks for its free slots).

Fair sharing (``fair_key``) is start-time fair queuing, kept in the store so it holds
across workers. Each (queue, priority) is a round of its own, with a virtual time ``vtime``
(starts at 0); each (queue, priority, fair key) has the tag of its last job. At enqueue a
job gets a ``fair_tag``:

* with a fair key: ``tag = max(last_tag[queue, priority, key], vtime[queue, priority]) + 1``,
  and ``last_tag[queue, priority, key] = tag`` (a batch takes consecutive tags, in order);
* without: ``tag = vtime[queue, priority] + 1`` (a job of its own, in the current round).

Claim order inside a queue is ``(priority, fair_tag, run_at, id)``, and a claim raises each
``vtime[queue, priority]`` to the largest tag it handed out at that priority. So a tenant
with 10,000 waiting jobs holds tags far ahead while a newcomer's jobs start at the current
round: they interleave. Without fair keys, tags never decrease with enqueue order, so the
queue stays FIFO by (priority, run_at, id) among jobs enqueued between claims. A job keeps
its tag through retries, lease expiry and release; ``redrive`` gives it a fresh tag as an
enqueue would (a bulk redrive of one tenant's dead jobs joins the back of that tenant's
line, not the front of everyone's). ``last_tag`` entries at or below their ``vtime`` mean
nothing and may be dropped by ``prune``.

Concurrency and rate limits are enforced by ``claim``, in the store, so they hold across
workers and machines. A job with a ``concurrency_key`` is claimed only while fewer than its
``concurrency_limit`` jobs with that key are ``running`` (counting the ones this claim hands
out). A job with a ``rate_key`` is claimed only while fewer than its ``rate_limit`` jobs with
that key were claimed in the last ``rate_period`` seconds (a sliding window; each attempt's
claim counts). A job over a limit stays ``available`` with its attempts untouched; the claim
passes over it to the jobs behind, looking at no more than ``CLAIM_SCAN`` waiting jobs in
all, so its cost stays bounded (a queue whose first ``CLAIM_SCAN`` jobs are all held back
claims nothing until one frees: give heavily limited work its own queue or a fair key).
"""

from __future__ import annotations

import abc
import os
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import LeaseLost, PayloadError, QueueFull
from ..job import Job, JobState

CLAIM_SCAN = 1000  # waiting jobs a claim may look at when limits hold some back
# Leases that may run out on a job before it started (held in a worker's prefetch, or claimed
# by a reply that never arrived) without costing it an attempt. Past this, such an expiry
# counts as an attempt, so a job that keeps getting lost unstarted still ends (as BullMQ's
# maxStalledCount bounds its stalls).
MAX_STALLS = 3
CLAIM_ID_RE = re.compile(r"[0-9a-f]{24}")


def check_claim_id(claim_id: str) -> str:
    """A claim id is 24 lowercase hex digits (96 random bits): the first part of every lease
    token the claim hands out, so a claimer whose reply was lost can name the claim's leases."""
    if not isinstance(claim_id, str) or not CLAIM_ID_RE.fullmatch(claim_id):
        raise ValueError(f"a claim id is 24 lowercase hex digits, got {claim_id!r}")
    return claim_id


def new_claim_id() -> str:
    return os.urandom(12).hex()


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


@dataclass(frozen=True)
class EnqueueResult:
    id: int
    created: bool  # False when unique_key matched an unfinished job, whose id is returned
    at: float  # the store's time of the write; a new job's created_at
    uid: str | None = None  # the new job's uid (see Job.uid); None when not created


def new_uids(n: int) -> list[str]:
    """``n`` job uids of 32 hex digits (128 random bits each) from one read of the OS's random
    source. Random, not counted: a store that lost data and counts its ids again from an older
    value still never repeats one."""
    raw = os.urandom(16 * n).hex()
    return [raw[i:i + 32] for i in range(0, 32 * n, 32)]


@dataclass(frozen=True)
class Lease:
    job_id: int
    token: str


@dataclass(frozen=True)
class ErrorInfo:
    """One failed attempt, as stored in the job's ``errors`` list."""

    kind: str  # "exception", "timeout", "rejected", "retry", "unknown_task", "bad_arguments", "lease_expired"
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

    @property
    def count(self) -> int:
        return len(self.requeued) + len(self.dead)


@dataclass(frozen=True)
class QueueStats:
    queue: str
    scheduled: int = 0
    available: int = 0  # includes scheduled jobs whose run_at has passed: they are waiting too
    running: int = 0
    succeeded: int = 0
    dead: int = 0
    cancelled: int = 0
    oldest_available_age: float | None = None  # seconds the oldest waiting job has been due
    lease_expiries: int = 0  # total leases that expired on this queue since the store was created
    expired_leases: int = 0  # running jobs whose lease has run out, not yet taken back by a reaper

    @property
    def depth(self) -> int:
        return self.available


def check_filters(**filters: str | None) -> None:
    """Refuse filter values a store cannot even encode (a lone surrogate, as a non-UTF-8 byte
    in argv becomes) with PayloadError rather than a driver's UnicodeEncodeError."""
    for name, value in filters.items():
        if value is None:
            continue
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise PayloadError(f"{name} filter {value!r} is not valid text (lone surrogate)") from None


def queue_full(queue: str, depth: int, limit: int) -> QueueFull:
    return QueueFull(
        f"queue {queue!r} is full: {depth} job(s) waiting, max_depth is {limit}; nothing was enqueued",
        queue=queue, depth=depth, limit=limit,
    )


def depth_limits(jobs: Sequence[NewJob]) -> dict[str, int]:
    """The max_depth of each queue a batch writes to, for queues that have one."""
    return {j.queue: j.max_depth for j in jobs if j.max_depth is not None}


def refuse_overflow(queue: str, limit: int, depth_after: int, jobs: Sequence[NewJob],
                    results: Sequence[EnqueueResult]) -> None:
    """Raise QueueFull if the batch, already written in the caller's open transaction, took
    ``queue`` past ``limit``; the caller's rollback then undoes the whole batch."""
    if depth_after > limit:
        added = sum(1 for j, r in zip(jobs, results, strict=True) if r.created and j.queue == queue)
        raise queue_full(queue, depth_after - added, limit)


def queue_stats_from_rows(
    now: float,
    counts: Iterable[Mapping[str, Any]],
    due: Iterable[Mapping[str, Any]],
    oldest: Iterable[Mapping[str, Any]],
    counters: Iterable[Mapping[str, Any]],
    expired: Iterable[Mapping[str, Any]] = (),
) -> list[QueueStats]:
    """Assemble per-queue stats from the SQL stores' rows: counts (queue, state, n), due
    scheduled jobs (queue, n, oldest), oldest available (queue, oldest), counters
    (queue, name, value) and running jobs past their lease (queue, n). Due scheduled jobs
    count as available: they are waiting too."""
    per: dict[str, dict[str, Any]] = {}

    def q(name: str) -> dict[str, Any]:
        return per.setdefault(name, {"queue": name})

    for row in counts:
        q(row["queue"])[row["state"]] = row["n"]
    for row in due:
        entry = q(row["queue"])
        entry["scheduled"] = entry.get("scheduled", 0) - row["n"]
        entry["available"] = entry.get("available", 0) + row["n"]
        entry["_oldest"] = row["oldest"]
    for row in oldest:
        entry = q(row["queue"])
        prev = entry.get("_oldest")
        entry["_oldest"] = row["oldest"] if prev is None else min(prev, row["oldest"])
    for row in counters:
        if row["name"] == "lease_expired":
            q(row["queue"])["lease_expiries"] = row["value"]
    for row in expired:
        q(row["queue"])["expired_leases"] = row["n"]
    queues = []
    for name in sorted(per):
        entry = per[name]
        oldest_at = entry.pop("_oldest", None)
        entry["oldest_available_age"] = max(0.0, now - oldest_at) if oldest_at is not None else None
        queues.append(QueueStats(**entry))
    return queues


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


ClaimReply = tuple[list[bool], list[Job]]


class LoopClaims(Protocol):
    """``ack_and_claim`` made from the worker's event loop, with the store's reply waking the
    loop itself: no hand-off to a thread and back, which took a quarter of a busy worker's
    claim cycle. Only the plain round trip is made on the loop. Anything that could block (no
    connection yet, a broken one, a reply that needs the careful path) comes back as a
    function that finishes the call the blocking way, for the worker to run on a thread; its
    result or error is then the call's, as ``Backend.ack_and_claim`` would give them."""

    async def ack_and_claim(
        self, acks: Sequence[tuple[Lease, str | None]], queue: str, limit: int, *, worker_id: str, lease_s: float,
        wanted: Callable[[], bool] | None = None, on_reply: Callable[[int], None] | None = None,
        start: int | None = None,
    ) -> ClaimReply | Callable[[], ClaimReply]:
        """``wanted``: the worker's "not stopping". A returned function that has sent nothing
        yet asks it before it claims; False makes it claim nothing (its acks are still
        written). One that finishes a call already sent settles what the store did.
        ``on_reply``: called with the number of jobs claimed once the store's reply is in, before
        it is read into jobs; it may send the next claim with ``claim_ahead``. ``start``: as
        ``Backend.claim``'s."""
        ...

    def claim_ahead(
        self, acks: Sequence[tuple[Lease, str | None]], queue: str, limit: int, *, worker_id: str, lease_s: float,
    ) -> Any:
        """Send an ``ack_and_claim`` without waiting for it; None if it could not be sent at
        once, and then nothing was. ``finish`` takes what it returns, before any other call.
        Its jobs are claimed held (``start=0``): the worker's slots are busy when it is sent."""
        ...

    async def finish(self, ahead: Any, on_reply: Callable[[int], None] | None = None,
                     ) -> ClaimReply | Callable[[], ClaimReply]:
        """The outcome of a claim ``claim_ahead`` sent, as ``ack_and_claim`` gives it."""
        ...

    def close(self) -> None:
        """Close its connection (the worker calls it once its claims are over)."""


class StoreLock(abc.ABC):
    """A named lock held in the store, so one process of the fleet at a time does a chore
    (see :meth:`Backend.try_lock`). It ends with ``release``, or on its own when its holder
    dies: with the holder's connection or process, or after ``ttl`` where the store counts
    time instead (a holder renews it between steps)."""

    @abc.abstractmethod
    def renew(self) -> bool:
        """Extend the lock by its ttl; False if it is no longer held (then stop the chore)."""

    @abc.abstractmethod
    def release(self) -> None:
        """Let go of the lock (nothing happens if it is no longer held)."""


LOCK_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def check_lock_name(name: str) -> str:
    """A lock name goes into a file name or a key: keep it to a safe alphabet."""
    if not LOCK_NAME_RE.fullmatch(name):
        raise ValueError(f"a lock name is 1-64 characters from A-Z a-z 0-9 _ . -, got {name!r}")
    return name


class _NoLock(StoreLock):
    """For a store without locks: every caller holds it (safe where the chore is idempotent)."""

    def __init__(self) -> None:
        self._held = True

    def renew(self) -> bool:
        return self._held

    def release(self) -> None:
        self._held = False


class Backend(abc.ABC):
    """A store of jobs. Instances are safe to share between threads of one process."""

    url: str

    # -- producer -----------------------------------------------------------------------
    @abc.abstractmethod
    def enqueue_many(self, jobs: Sequence[NewJob], *, now: float | None = None) -> list[EnqueueResult]:
        """Write all jobs in one atomic operation and return their ids, in order.

        A job with ``max_depth`` may not take its queue's waiting jobs (scheduled and
        available; running ones don't count) past that limit: then the whole batch is
        refused with QueueFull and nothing is written.
        """

    # -- worker (fenced) ----------------------------------------------------------------
    @abc.abstractmethod
    def claim(
        self, queue: str, limit: int, *, worker_id: str, lease_s: float, now: float | None = None,
        start: int | None = None, claim_id: str | None = None,
    ) -> list[Job]:
        """Lease up to ``limit`` due jobs of ``queue`` in (priority, fair_tag, run_at, id) order.

        Each claimed job is ``running`` with ``attempts`` + 1, a fresh lease token and
        ``lease_expires_at = now + lease_s``. Scheduled jobs that are due are promoted first.

        ``start``: how many of them (the first, in claim order) start at once; the others are
        held (a worker's prefetch) until a heartbeat says they started. None: all start. A
        lease that runs out on a held job gives it back uncounted (see ``reap``).
        ``claim_id`` (check_claim_id; a random one if None): every lease token of this claim
        begins with it, so ``release_claim`` can give back a claim whose reply was lost.
        """

    @abc.abstractmethod
    def heartbeat(self, leases: Sequence[Lease], *, lease_s: float, now: float | None = None,
                  held: Collection[int] = ()) -> set[int]:
        """Extend every lease still held to ``now + lease_s``; return the ids whose lease is lost.

        Every job whose id is not in ``held`` (claimed held, and still waiting for a slot) is
        marked started: from now on its lease running out counts as an attempt. This rides on
        the heartbeat's own write of each lease."""

    @abc.abstractmethod
    def ack(self, lease: Lease, result: str | None, *, now: float | None = None) -> None:
        """Mark the job succeeded with ``result`` (JSON text). Raises LeaseLost."""

    def ack_many(self, acks: Sequence[tuple[Lease, str | None]], *, now: float | None = None) -> list[bool]:
        """Ack several jobs, in one transaction where the store allows: True for each ack whose
        lease still held. A refused ack changes nothing and does not stop the others."""
        done = []
        for lease, result in acks:
            try:
                self.ack(lease, result, now=now)
                done.append(True)
            except LeaseLost:
                done.append(False)
        return done

    def ack_and_claim(
        self, acks: Sequence[tuple[Lease, str | None]], queue: str, limit: int, *,
        worker_id: str, lease_s: float, now: float | None = None, start: int | None = None,
    ) -> tuple[list[bool], list[Job]]:
        """``ack_many(acks)`` then ``claim(queue, limit)``, in one round trip where the store
        allows (a busy worker's finished jobs ride with its next claim, as BullMQ's
        moveToFinished fetches the next job). The acks are durable before, or together with,
        the claim. If it raises, write the acks again with ``ack_many``; jobs it may have
        claimed without saying so come back when their leases expire."""
        held = self.ack_many(acks, now=now) if acks else []
        return held, self.claim(queue, limit, worker_id=worker_id, lease_s=lease_s, now=now, start=start)

    def loop_claims(self) -> LoopClaims | None:
        """An ``ack_and_claim`` the worker's event loop can await itself, or None (the default):
        the worker then claims on a thread of its own. See :class:`LoopClaims`."""
        return None

    @abc.abstractmethod
    def retry(self, lease: Lease, error: ErrorInfo, *, delay: float, now: float | None = None) -> JobState:
        """Record the failure and make the job due again at ``now + delay``. Raises LeaseLost.

        Returns the new state: ``scheduled``/``available``, or ``dead`` if no attempts are left.
        """

    @abc.abstractmethod
    def kill(self, lease: Lease, error: ErrorInfo, *, now: float | None = None) -> None:
        """Record the failure and move the job to ``dead`` (the dead-letter queue). Raises LeaseLost."""

    @abc.abstractmethod
    def release(self, leases: Sequence[Lease], *, now: float | None = None) -> list[int]:
        """Give jobs back unrun (graceful shutdown): ``available`` at once, the attempt not counted.

        Returns the ids released; stale leases are skipped, not raised.
        """

    @abc.abstractmethod
    def release_claim(self, queue: str, claim_id: str, *, now: float | None = None) -> list[int]:
        """Give back unrun, as ``release`` does, every job of ``queue`` still running under a
        lease of the claim ``claim_id`` (its tokens begin with it): a claim whose reply was lost,
        so nobody holds its jobs. The ids released, ascending. A rare path: it may look at every
        running job of the queue."""

    # -- maintenance (idempotent, bounded, safe to run on every worker) -------------------
    @abc.abstractmethod
    def reap(self, *, limit: int = 1000, now: float | None = None) -> ReapResult:
        """Jobs whose lease expired go back to ``available``, or ``dead`` if out of attempts.

        Each expiry is recorded as a ``lease_expired`` error and counted per queue. A job that
        never started (claimed held, see ``claim``) is not charged the attempt: it goes back
        ``available`` with ``attempts`` - 1 and ``stalls`` + 1, unless it has stalled
        ``MAX_STALLS`` times already; then the expiry counts as an attempt.
        """

    @abc.abstractmethod
    def promote(self, *, limit: int = 1000, now: float | None = None) -> int:
        """Scheduled jobs whose run_at has come become ``available``."""

    def maintenance_turn(self, interval: float) -> bool:
        """Whether the caller should reap and promote now: True for one caller per ``interval``
        seconds across every process on the store, so a fleet of workers does that work once
        per interval instead of once each. The default, for a store where those calls cost
        little, always says yes."""
        return True

    @abc.abstractmethod
    def prune(
        self, *, older_than: float, states: Sequence[JobState] = (JobState.SUCCEEDED,),
        limit: int = 1000, now: float | None = None,
    ) -> int:
        """Delete up to ``limit`` jobs in ``states`` that finished more than ``older_than`` seconds ago."""

    # -- inspection and administration ----------------------------------------------------
    @abc.abstractmethod
    def get(self, job_id: int) -> Job | None: ...

    @abc.abstractmethod
    def list_jobs(
        self, *, state: JobState | None = None, queue: str | None = None, task: str | None = None,
        cursor: int | None = None, limit: int = 50,
    ) -> Page:
        """Jobs newest first (descending id); ``cursor`` is the ``next_cursor`` of the previous page."""

    @abc.abstractmethod
    def stats(self, *, now: float | None = None, worker_ttl: float = 60.0, finished: bool = True) -> Stats:
        """Per-queue counts, oldest waiting age and lease expiries; workers seen within ``worker_ttl``.

        ``finished=False`` leaves succeeded and cancelled jobs uncounted (reported as 0): their
        number grows with retention, while everything else is read from indexes over
        unfinished and dead jobs, so a scrape stays cheap however much history is kept.
        """

    @abc.abstractmethod
    def redrive(self, job_ids: Sequence[int] | None = None, *, queue: str | None = None,
                now: float | None = None) -> int:
        """Dead jobs (these ids, or all of ``queue``, or all) back to ``available`` with attempts reset."""

    @abc.abstractmethod
    def purge(self, *, state: JobState = JobState.DEAD, queue: str | None = None,
              job_ids: Sequence[int] | None = None) -> int:
        """Delete finished jobs in ``state`` (never unfinished ones)."""

    @abc.abstractmethod
    def cancel(self, job_id: int, *, now: float | None = None) -> bool:
        """Cancel an unfinished job. A running job loses its lease, so its worker stops it."""

    @abc.abstractmethod
    def wait_for_jobs(self, queues: Sequence[str], timeout: float, *, verify: bool = True) -> bool:
        """Block up to ``timeout`` seconds until jobs may be due on ``queues``; True if woken early.

        A wake-up (a marker, a notification) only says something changed. With ``verify`` the
        store is looked at again before True is returned, so a stale wake-up goes back to
        sleep; without it True comes at once, for a caller whose next step, a claim, is that
        look. Either way, a job already waiting when the call starts returns True at once."""

    def wait_and_claim(
        self, queues: Sequence[str], timeout: float, claims: Sequence[tuple[str, int]], *,
        worker_id: str, lease_s: float, start: int | None = None,
    ) -> tuple[bool, list[Job] | None]:
        """``wait_for_jobs(verify=False)`` for an idle worker whose next step is a claim: a store
        that can make the claims of ``claims`` (queue, how many) in the same round trip as the
        wake-up does so, and returns the jobs. Returns (woken, jobs): jobs is None when no claim
        was made (the caller claims if woken), else the jobs those claims took, which may be
        none (a stale wake-up). ``start``: how many of the jobs start at once, in the order of
        ``claims`` (see ``claim``). The default makes no claim."""
        return self.wait_for_jobs(queues, timeout, verify=False), None

    def try_lock(self, name: str, *, ttl: float) -> StoreLock | None:
        """Take the store-wide lock ``name``, or return None at once if anyone holds it (this
        backend too: it is not re-entrant). A holder that dies without releasing frees it with
        its connection or process, or at the latest after ``ttl`` seconds. The default, for a
        store without locks, never refuses."""
        return _NoLock()

    # -- workers --------------------------------------------------------------------------
    @abc.abstractmethod
    def record_worker(self, info: WorkerInfo, *, now: float | None = None) -> None:
        """Insert or refresh a worker's row (``last_seen`` = now)."""

    @abc.abstractmethod
    def remove_worker(self, worker_id: str) -> None: ...

    @abc.abstractmethod
    def now(self) -> float:
        """The store's clock, unix seconds."""

    # -- cron and exactly-once steps --------------------------------------------------------
    def cron_enqueue(self, schedule: str, tick: float, job: NewJob | None, *,
                     now: float | None = None) -> EnqueueResult | None:
        """Take ``schedule``'s tick at ``tick`` (unix seconds) and enqueue ``job`` for it, in one
        atomic operation: if the schedule's last recorded tick is older than ``tick`` (or there
        is none), record ``tick`` and write the job; otherwise change nothing and return None.
        So any number of schedulers enqueue each tick once. ``job=None`` only records the tick
        (a new schedule starts from "now" rather than running a tick from before it existed).
        QueueFull (max_depth) leaves the tick unrecorded, so it is tried again."""
        raise NotImplementedError(f"{type(self).__name__} has no cron support")

    def cron_ticks(self) -> dict[str, float]:
        """The last tick taken per schedule name (unix seconds)."""
        raise NotImplementedError(f"{type(self).__name__} has no cron support")

    def record_step(self, job_id: int, step: str, result: str | None, *, uid: str | None) -> tuple[bool, str | None]:
        """Record that ``step`` of job ``job_id`` finished with ``result`` (JSON text), unless a
        record for it exists already. Returns (created, the stored result): the first record
        wins. Not fenced by a lease: an attempt that did the step, even one that has since lost
        its lease, tells the truth by recording it. ``uid`` is the job's ``Job.uid`` (None for a
        job stored before uids existed): a job with that id but another uid is another job
        that took the id after the store lost data, so the record is refused as for an unknown
        job, with JobNotFound."""
        raise NotImplementedError(f"{type(self).__name__} has no step records")

    def reserve_connections(self, slots: int) -> list[str]:
        """A worker on this backend runs up to ``slots`` more tasks at once (fewer, if negative:
        it stopped). A store whose tasks may each hold a pooled connection (PostgreSQL's
        ``transaction()``) sizes its pool to match; the answer is warnings to log (a size the
        user fixed too small). Default: nothing to do."""
        return []

    def startup_warnings(self) -> list[str]:
        """Settings of the store that put acknowledged jobs at risk; a worker logs them at start."""
        return []

    def wake(self) -> None:  # noqa: B027 - optional hook: a backend without local waiters has nothing to do
        """Wake this process's threads blocked in wait_for_jobs (used at shutdown)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. The backend must not be used afterwards."""
