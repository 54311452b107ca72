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

Dependencies (workflows). A job written with parents (``NewJob.after`` ids, ``after_refs``
positions in the same write) records one edge per parent and starts ``waiting`` while any parent
is unfinished. The rules, the same on every store:

* Enqueue checks every parent in the same atomic write. An unknown id, or a reference to its own
  or a later position, raises UnknownParent and writes nothing (so no cycle can form: a new job
  can only come after jobs that exist before it). A parent already ``succeeded`` counts as done;
  one already ``dead`` or ``cancelled`` counts as a failed parent (below). A job whose parents
  are all done goes straight to ``available``/``scheduled``.
* When a parent reaches a final state, each of its ``waiting`` children is settled in the same
  transaction or script as that transition (ack, ack_many, ack_and_claim, retry that goes dead,
  kill, reap that goes dead, cancel, and PostgreSQL's transactional completion): success counts
  the parent done; ``dead`` or ``cancelled`` cancels a child with ``on_parent_failure="cancel"``
  (recorded in its errors as kind ``parent_failed``, naming the parent) and counts the parent
  done for one with ``"run"``. The child whose last parent is done becomes ``available`` (or
  ``scheduled`` until its ``run_at``), exactly once however many parents finish at the same
  moment. A child cancelled this way settles its own children in turn (a cascade, in the same
  write). A fast path stays fast: a job that has no children pays for none of this.
* ``cancel`` of a waiting job works as for any unfinished job, and cascades the same way.
  ``redrive`` of a dead parent does not revive children already cancelled.
* ``claim`` never takes a ``waiting`` job; ``reap`` and ``promote`` never touch one.
* ``prune`` never deletes a finished job that has an unfinished child (the child may still read
  its result: ``parent_results``), so a workflow's jobs go together once its last job finished.
  Batch records go with their last member.
* Batches (``enqueue_many(..., batches=[NewBatch])``): see NewBatch. A batch's callbacks are jobs
  with ``callback_of`` set and ``after`` every member; ``on_success`` is the one with
  ``on_parent_failure="cancel"`` (it runs only if every member succeeded), ``on_complete`` the
  one with ``"run"``. ``get_batch`` counts members by state, nested batches included.

Pausing a queue (``pause_queue``, ``resume_queue``, ``paused_queues``). The pause is stored in
the store, so every worker, the CLI and the dashboard agree on it:

* No claim path of any store hands out a job of a paused queue: ``claim``, the claim part of
  ``ack_and_claim``, the loop claims and ``wait_and_claim``'s claims all take nothing there
  (the acks ride on as usual). The check is in the claim's own statement or script, one lookup
  in a small table or hash, so the fast path stays one round trip. A claim that began before
  the pause was written may still take jobs; none that begins after it does.
* Everything else goes on: enqueues succeed (``max_depth`` still counts), due scheduled jobs are
  promoted, running jobs heartbeat, ack, retry and fail as usual. So pausing is a drain: the
  jobs already running finish and no new one starts.
* ``wait_for_jobs`` does not report the waiting jobs of a paused queue (an idle worker whose
  queues are all paused sleeps until a wake-up or its poll, instead of waking to empty claims),
  and ``resume_queue`` wakes idle workers of the queue as an enqueue does.
* ``stats`` reports ``QueueStats.paused`` and lists a paused queue even when it holds no job;
  its depth and oldest age are measured as for any queue.

Beside this module: ``types.py`` holds the values that cross the seam (NewJob, Lease,
ErrorInfo, Stats, ...), ``capabilities.py`` what a store can do as protocols (wake-ups, cron,
steps, transactional completion, loop claims), and ``common.py`` helpers the stores share.
Every name is importable from here too.
"""

from __future__ import annotations

import abc
import contextlib
import time
from collections.abc import Callable, Collection, Iterator, Sequence

from ..bulk import BULK_BATCH, BulkAction, BulkResult, JobFilter, run_batch
from ..errorgroups import ErrorGroups, Grouper
from ..errors import ClaimLost, LeaseLost, StoreError
from ..job import Job, JobState
from .capabilities import (
    CronStore,
    LoopClaims,
    StepStore,
    TransactionalStore,
    WakeUps,
    transactional,
)
from .common import (
    CLAIM_ID_RE,
    LOCK_NAME_RE,
    check_claim_id,
    check_filters,
    check_lock_name,
    depth_limits,
    new_claim_id,
    new_uid_text,
    new_uids,
    queue_full,
    queue_stats_from_rows,
    refuse_overflow,
)
from .history import HistoryPoint
from .types import (
    BatchInfo,
    ClaimReply,
    CronState,
    EnqueueResult,
    ErrorInfo,
    ErrorKind,
    Lease,
    NewBatch,
    NewJob,
    Page,
    QueueStats,
    ReapResult,
    Stats,
    WorkerInfo,
)

# Existing importers name all of these from here.
__all__ = [
    "CLAIM_ID_RE", "CLAIM_SCAN", "LOCK_NAME_RE", "MAX_STALLS", "Backend", "BatchInfo",
    "ClaimReply",
    "CronState", "CronStore", "EnqueueResult", "ErrorInfo", "ErrorKind", "HistoryPoint", "Lease",
    "LoopClaims", "NewBatch", "NewJob",
    "Page", "QueueStats", "ReapResult", "Stats", "StepStore", "StoreLock",
    "TransactionalStore", "WakeUps", "WorkerInfo", "check_claim_id", "check_filters",
    "check_lock_name", "depth_limits", "new_claim_id", "new_uid_text", "new_uids", "queue_full",
    "queue_stats_from_rows", "refuse_overflow", "transactional",
]

CLAIM_SCAN = 1000  # waiting jobs a claim may look at when limits hold some back
# Leases that may run out on a job before it started (held in a worker's prefetch, or claimed
# by a reply that never arrived) without costing it an attempt. Past this, such an expiry
# counts as an attempt, so a job that keeps getting lost unstarted still ends (as BullMQ's
# maxStalledCount bounds its stalls).
MAX_STALLS = 3
ERROR_GROUP_SCAN = 10_000  # jobs Backend.error_groups looks at, at most, by default


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
    # What this store cannot do, by capability name (see broker/core.py's MISSING; the stores
    # of job tables miss nothing). A caller that can go on without one asks here first (the
    # worker's history recorder); everything else raises Unsupported when it is used.
    missing: frozenset[str] = frozenset()

    # -- producer -----------------------------------------------------------------------
    @abc.abstractmethod
    def enqueue_many(self, jobs: Sequence[NewJob], *, now: float | None = None,
                     batches: Sequence[NewBatch] = ()) -> list[EnqueueResult]:
        """Write all jobs in one atomic operation and return their ids, in order.

        A job with ``max_depth`` may not take its queue's waiting jobs (scheduled and
        available; running ones don't count) past that limit: then the whole batch is
        refused with QueueFull and nothing is written.

        Jobs with ``after``/``after_refs`` and the ``batches`` records are written in the same
        operation (see "Dependencies" above). A job with a ``unique_key`` that matches an
        unfinished job is not created (its id is returned, as always); a later job of the same
        call that refers to it by ``after_refs`` depends on that existing job.
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

    def take(self, job_id: int, token: str, *, worker_id: str, lease_s: float,
             now: float | None = None, message: str | None = None) -> Job | None:
        """Lease the job ``job_id`` for a delivery a message broker made: the store is then a
        broker's companion (broker/companion.py), which keeps the job records while the broker
        decides which worker runs what, and when.

        The job becomes ``running`` with ``attempts`` + 1, lease ``token`` (the caller's: it
        begins with a claim id, as a claim's do), ``worker_id``, ``attempted_at = now`` and
        ``lease_expires_at = now + lease_s``, and is returned as ``claim`` returns jobs (steps
        included). It is taken whatever its ``run_at`` (the broker held the delay) and whatever
        lease it held: the broker handed the message out again because its holder stopped
        answering, so that holder is fenced (its token no longer matches) and the attempt it
        lost is recorded as a ``lease_expired`` error, as ``reap`` records one; if that was its
        last attempt (``attempts`` = ``max_attempts``), the job goes ``dead`` instead, as
        ``reap`` makes it (children settled, waiters woken), and None is returned. Returns None,
        changing nothing, when the store holds no such job or it cannot run: finished
        (succeeded, dead or cancelled: the message is a duplicate, or the job was cancelled) or
        ``waiting``. Not counted against concurrency or rate limits, nor the queue's pause:
        the companion refuses jobs that have them.

        ``message`` (where the broker names its messages, the end of every token given for a
        delivery of one message): a lease still live (``lease_expires_at`` > now) whose token
        ends with it is not taken over, and None is returned, changing nothing. Its holder runs
        this very message: the broker handed it to two receivers at once (SQS's at-least-once
        delivery does), not again because the holder stopped answering."""
        raise NotImplementedError(f"{type(self).__name__} cannot serve as a broker's companion")

    # -- a broker companion's outbox (broker/companion.py) --------------------------------
    outbox: bool = False
    """Set by a broker's companion. While True, ``enqueue_many`` and ``cron_enqueue`` mark
    every job they create, in the same atomic write, as one whose message the broker has not
    confirmed yet (the mark's time is the write's ``now``). The companion clears the marks once
    the broker confirmed; a process that died in between leaves them, and ``outbox_sweep``
    finds them. Costs nothing while False."""

    def outbox_mark(self, job_ids: Sequence[int], *, now: float | None = None) -> None:
        """Mark these jobs (known or not, any state) as above, at ``now``: before a write that
        makes them due again without a message (the companion's redrive)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no outbox")

    def outbox_confirm(self, job_ids: Sequence[int]) -> None:
        """Clear the marks of these jobs (their messages are confirmed); others are left."""
        raise NotImplementedError(f"{type(self).__name__} keeps no outbox")

    def outbox_sweep(self, *, older_than: float, limit: int = 100,
                     now: float | None = None) -> list[Job]:
        """Up to ``limit`` marks made before ``now - older_than``, oldest first, in one atomic
        write: a mark whose job is ``available`` or ``scheduled`` is renewed at ``now`` (so it
        is not swept again before another ``older_than`` passes) and the job returned, for its
        message to be published again and then confirmed; any other mark (its job running,
        finished, waiting, or gone: a message of it exists or none is needed) is cleared. The
        jobs in ascending id order. A batch whose marks all need no message is cleared and the
        next one looked at (each in a write of its own), so an empty answer means no due mark
        needs a message: the caller sweeps until then."""
        raise NotImplementedError(f"{type(self).__name__} keeps no outbox")

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

    def ack_many(self, acks: Sequence[tuple[Lease, str | None]], *,
                 now: float | None = None) -> list[bool]:
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
        the claim. If it raises :class:`~conveyor.errors.ClaimLost`, the acks were written and
        its ``acks_held`` says which held; if it raises anything else, write the acks again
        with ``ack_many``. Jobs it may have claimed without saying so come back when their
        leases expire."""
        held = self.ack_many(acks, now=now) if acks else []
        try:
            jobs = self.claim(queue, limit, worker_id=worker_id, lease_s=lease_s, now=now,
                              start=start)
        except StoreError as exc:
            if not acks:
                raise
            # Written again, each ack would be refused (its lease is gone with it) and its
            # job logged as a success discarded for a lost lease.
            raise ClaimLost(f"{exc}; {sum(held)} of {len(acks)} acks written before the "
                            "claim failed", held) from exc
        return held, jobs

    def loop_claims(self) -> LoopClaims | None:
        """An ``ack_and_claim`` the worker's event loop can await itself, or None (the default):
        the worker then claims on a thread of its own. See :class:`LoopClaims`."""
        return None

    @abc.abstractmethod
    def retry(self, lease: Lease, error: ErrorInfo, *, delay: float,
              now: float | None = None) -> JobState:
        """Record the failure and make the job due again at ``now + delay``. Raises LeaseLost.

        Returns the new state: ``scheduled``/``available``, or ``dead`` if no attempts are left.
        """

    @abc.abstractmethod
    def kill(self, lease: Lease, error: ErrorInfo, *, now: float | None = None) -> None:
        """Record the failure and move the job to ``dead`` (the dead-letter queue). Raises
        LeaseLost."""

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
        """Delete up to ``limit`` jobs in ``states`` that finished more than ``older_than``
        seconds ago."""

    # -- inspection and administration ----------------------------------------------------
    @abc.abstractmethod
    def get(self, job_id: int) -> Job | None: ...

    def get_batch(self, batch_id: str) -> BatchInfo | None:
        """The batch's counts and callbacks (see BatchInfo), or None if the store holds no such
        batch (never written, or pruned with its last member)."""
        raise NotImplementedError(f"{type(self).__name__} has no batches yet")

    @abc.abstractmethod
    def list_jobs(
        self, *, state: JobState | None = None, queue: str | None = None, task: str | None = None,
        cursor: int | None = None, limit: int = 50,
    ) -> Page:
        """Jobs newest first (descending id); ``cursor`` is the ``next_cursor`` of the previous
        page."""

    @abc.abstractmethod
    def stats(self, *, now: float | None = None, worker_ttl: float = 60.0,
              finished: bool = True) -> Stats:
        """Per-queue counts, oldest waiting age and lease expiries; workers seen within
        ``worker_ttl``.

        ``finished=False`` leaves succeeded and cancelled jobs uncounted (reported as 0): their
        number grows with retention, while everything else is read from indexes over
        unfinished and dead jobs, so a scrape stays cheap however much history is kept.
        """

    @abc.abstractmethod
    def redrive(self, job_ids: Sequence[int] | None = None, *, queue: str | None = None,
                now: float | None = None) -> int:
        """Dead jobs (these ids, or all of ``queue``, or all) back to ``available`` with
        attempts reset."""

    @abc.abstractmethod
    def purge(self, *, state: JobState = JobState.DEAD, queue: str | None = None,
              job_ids: Sequence[int] | None = None) -> int:
        """Delete finished jobs in ``state`` (never unfinished ones)."""

    @abc.abstractmethod
    def cancel(self, job_id: int, *, now: float | None = None) -> bool:
        """Cancel an unfinished job. A running job loses its lease, so its worker stops it."""

    # -- error groups and bulk actions (issue 38) -------------------------------------------
    def error_groups(self, *, state: JobState = JobState.DEAD, queue: str | None = None,
                     task: str | None = None, limit: int = 100,
                     scan: int = ERROR_GROUP_SCAN) -> ErrorGroups:
        """Jobs grouped by the cause of their last error: (task, error type, message normalised
        by ``errorgroups.normalise``), most jobs first, at most ``limit`` groups, each with its
        count, first and last failure time and its newest job's id.

        ``state``: ``dead`` (the default), or ``scheduled`` for failed jobs waiting for a retry
        (a scheduled job without errors is left out). Bounded: looks at no more than ``scan``
        jobs, the newest (SQL stores: the latest finished dead jobs, or the scheduled ones due
        soonest, by an index over that state; the default walks ``list_jobs`` pages). Past
        that, ``complete`` is False and the counts are of the jobs looked at."""
        if state not in (JobState.DEAD, JobState.SCHEDULED):
            raise ValueError(f"error groups are of dead or scheduled jobs, not {state}")
        check_filters(queue=queue, task=task)
        grouper = Grouper()
        cursor: int | None = None
        looked = 0
        while looked < scan:
            page = self.list_jobs(state=state, queue=queue, task=task, cursor=cursor,
                                  limit=min(500, scan - looked))
            looked += max(len(page.jobs), 1)
            grouper.add_jobs(page.jobs)
            if page.next_cursor is None:
                return grouper.result(limit, complete=True)
            cursor = page.next_cursor
        return grouper.result(limit, complete=False)

    def make_due(self, job_ids: Sequence[int], *, now: float | None = None) -> int:
        """The ``scheduled`` jobs among ``job_ids`` become ``available`` now (``run_at`` =
        now), in one atomic write: a bulk "run now", or "retry now" of failed jobs waiting for
        their backoff. Jobs in any other state are left alone. Returns how many changed."""
        raise NotImplementedError(f"{type(self).__name__} cannot make jobs due yet")

    def bulk(self, action: BulkAction, where: JobFilter, *, limit: int = BULK_BATCH,
             cursor: int | None = None, now: float | None = None) -> BulkResult:
        """One batch of a bulk action on the jobs ``where`` selects: ``retry`` (dead jobs are
        redriven, scheduled ones that failed become due now), ``run_now`` (scheduled jobs become
        due now), ``cancel`` (unfinished jobs; a waiting one cascades) or ``delete`` (finished
        jobs). Acts on at most ``limit`` jobs and looks at no more than ``max(4 * limit,
        2000)``, walking ``list_jobs`` pages newest first from ``cursor``; the batch is written
        by ``redrive``/``make_due``/``cancel_many``/``purge`` (one atomic write each). Call
        again with the result's ``cursor`` until it is None."""
        return run_batch(self, BulkAction(action), where, limit=limit, cursor=cursor, now=now)

    # -- cancelling many jobs at once (issue 38, bulk cancel) ---------------------------------
    def cancel_many(self, job_ids: Sequence[int], *, now: float | None = None) -> list[int]:
        """Cancel the unfinished jobs among ``job_ids``, each as ``cancel`` does (a running job
        loses its lease; a cancelled job's waiting children are settled, a cascade; its unique
        key is freed and job.wait woken). Finished and unknown ids are skipped. Returns the ids
        cancelled, ascending.

        The stores write the whole call in one atomic write: its jobs are cancelled together,
        then the cascade settles their children, so a child named in the call is cancelled by
        the call (and returned) even if its parent is too. This default, for stores without
        their own, is one ``cancel`` per id in ascending order: there a parent's cascade may
        cancel such a child first, and it is not returned."""
        return [i for i in sorted({int(i) for i in job_ids}) if self.cancel(i, now=now)]

    # -- waiting for one job to finish (FinishWaits) ---------------------------------------
    finish_poll: tuple[float, float] = (0.01, 1.0)
    """``wait_finished``'s looks at the job between wake-ups: the first pause and the longest
    one, doubling in between (seconds). A safety net where the store wakes waiters; the only
    way to see another process finish the job where it cannot (SQLite)."""

    def wait_finished(self, job_id: int, timeout: float) -> Job | None:
        """The job once it is final, or as it is when ``timeout`` seconds run out (``inf``: no
        limit); None if there is no such job. Looks at the job, then sleeps in
        ``finish_watch`` until woken or the next look is due (see ``finish_poll``)."""
        deadline = time.monotonic() + timeout
        job = self.get(job_id)
        if job is None or job.is_final or timeout <= 0:
            return job  # no watch (a connection, a mark on the job) for what is settled
        pause, longest = self.finish_poll
        with self.finish_watch(job_id) as sleep:
            while True:
                job = self.get(job_id)
                remaining = deadline - time.monotonic()
                if job is None or job.is_final or remaining <= 0:
                    return job
                sleep(min(pause, remaining))
                pause = min(pause * 2, longest)

    @contextlib.contextmanager
    def finish_watch(self, job_id: int) -> Iterator[Callable[[float], None]]:
        """Watch for ``job_id`` finishing while the block runs: yields ``sleep(seconds)``, which
        returns early when the store says the job may have finished (a wake-up only says
        "look again"). Entered before the first look, so a finish in between is not missed.
        The default wakes for nothing: a poll. Stores override it with their wake-ups, and
        finish jobs without extra work when nobody watches."""
        yield time.sleep

    # -- waiting for jobs (WakeUps) -------------------------------------------------------
    @abc.abstractmethod
    def wait_for_jobs(self, queues: Sequence[str], timeout: float, *, verify: bool = True) -> bool:
        """Block up to ``timeout`` seconds until jobs may be due on ``queues``; True if woken early.

        A wake-up (a marker, a notification) only says something changed. With ``verify`` the
        store is looked at again before True is returned, so a stale wake-up goes back to
        sleep; without it True comes at once, for a caller whose next step, a claim, is that
        look. Either way, a job already waiting when the call starts returns True at once."""

    def ready_queues(self, queues: Sequence[str]) -> list[str]:
        """Those of ``queues`` that hold a job a claim could take now (available, or scheduled
        and due; the queue not paused), in the given order: one look for a worker on many
        queues, which then claims where there is work instead of calling the store once per
        queue until it finds some. A store that cannot tell returns them all."""
        return list(queues)

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

    # -- pausing queues (see "Pausing a queue" above) ---------------------------------------
    @abc.abstractmethod
    def pause_queue(self, queue: str, *, now: float | None = None) -> bool:
        """Stop every claim of ``queue`` from now on; running jobs finish as usual. True if
        this paused it, False if it was paused already (its "paused since" is kept)."""

    @abc.abstractmethod
    def resume_queue(self, queue: str, *, now: float | None = None) -> bool:
        """Let ``queue`` be claimed again and wake idle workers of it. True if it was paused."""

    @abc.abstractmethod
    def paused_queues(self) -> dict[str, float]:
        """Every paused queue and since when (unix seconds)."""

    # -- workers --------------------------------------------------------------------------
    @abc.abstractmethod
    def record_worker(self, info: WorkerInfo, *, now: float | None = None) -> None:
        """Insert or refresh a worker's row (``last_seen`` = now)."""

    @abc.abstractmethod
    def remove_worker(self, worker_id: str) -> None: ...

    @abc.abstractmethod
    def now(self) -> float:
        """The store's clock, unix seconds."""

    # -- cron and exactly-once steps (CronStore, StepStore) ----------------------------------
    @abc.abstractmethod
    def cron_enqueue(self, schedule: str, tick: float, job: NewJob | None, *,
                     now: float | None = None) -> EnqueueResult | None:
        """Take ``schedule``'s tick at ``tick`` (unix seconds) and enqueue ``job`` for it, in one
        atomic operation: if the schedule's last recorded tick is older than ``tick`` (or there
        is none), record ``tick`` and write the job; otherwise change nothing and return None.
        So any number of schedulers enqueue each tick once. ``job=None`` only records the tick
        (a new schedule starts from "now" rather than running a tick from before it existed).
        QueueFull (max_depth) leaves the tick unrecorded, so it is tried again."""

    @abc.abstractmethod
    def cron_ticks(self) -> dict[str, float]:
        """The last tick taken per schedule name (unix seconds)."""

    # -- cron controls (CronStore): disable, enable, last run -------------------------------
    # Kept beside the tick records, so every scheduler, the CLI and the dashboard agree. Rules:
    # * cron_enqueue checks the schedule's state in the same atomic operation that takes the
    #   tick: a disabled schedule's tick is taken (recorded) and no job is written, however
    #   recently a scheduler read it as enabled. A tick earlier than the schedule's enabled_at
    #   is taken the same way, so enabling resumes from the first tick after it: no tick that
    #   fell while it was disabled runs, whether or not a scheduler came by meanwhile.
    # * cron_enqueue records the id of the job it writes as the schedule's last_job_id (the
    #   holder's id when the tick's unique key was held); a tick taken without a job keeps it.
    @abc.abstractmethod
    def set_cron_enabled(self, schedule: str, enabled: bool, *,
                         now: float | None = None) -> bool:
        """Disable (``enabled=False``: ``disabled_at`` = now) or enable (``disabled_at`` cleared,
        ``enabled_at`` = now) a schedule. Returns False and changes nothing when it is so
        already (a schedule the store has no record of is enabled). Disabling a schedule no
        scheduler has seen records now as its last tick, as a first sight would."""

    @abc.abstractmethod
    def cron_states(self) -> dict[str, CronState]:
        """Every schedule the store has a record of, by name: see CronState."""

    @abc.abstractmethod
    def record_step(self, job_id: int, step: str, result: str | None, *,
                    uid: str | None) -> tuple[bool, str | None]:
        """Record that ``step`` of job ``job_id`` finished with ``result`` (JSON text), unless a
        record for it exists already. Returns (created, the stored result): the first record
        wins. Not fenced by a lease: an attempt that did the step, even one that has since lost
        its lease, tells the truth by recording it. ``uid`` is the job's ``Job.uid`` (None for a
        job stored before uids existed): a job with that id but another uid is another job
        that took the id after the store lost data, so the record is refused as for an unknown
        job, with JobNotFound."""

    # -- history (backends/history.py) --------------------------------------------------------
    # Per queue per minute counts the workers add up (processed, failed, dead, latency sums),
    # kept for the dashboard's charts and ``conveyor stats --history``. Every store keeps them.
    def record_history(self, points: Sequence[HistoryPoint]) -> None:
        """Add each point's counts to the stored row of its (queue, minute), creating it, all in
        one atomic write: two workers adding to the same row both count. ``points`` are minute
        points (``span`` MINUTE, ``at`` a whole minute); a (queue, minute) may come more than
        once. Not fenced and not idempotent: a write sent twice counts twice."""
        raise NotImplementedError(f"{type(self).__name__} keeps no history")

    def history(self, *, queue: str | None = None, since: float,
                until: float) -> list[HistoryPoint]:
        """The stored rows of ``queue`` (None: every queue) whose bucket starts in
        [``since``, ``until``), ordered by (at, queue): minute rows where they are kept (the
        last MINUTES_KEPT), hourly rows beyond. A bucket's start, not its end, decides: an hour
        that starts before ``since`` is left out. Rolled-up and minute rows of one hour may both
        be there for a moment (a late flush); a reader sums what it is given."""
        raise NotImplementedError(f"{type(self).__name__} keeps no history")

    def rollup_history(self, *, keep_days: float, limit: int = 1000,
                       now: float | None = None) -> int:
        """Retention of the history, bounded: up to ``limit`` minute rows (Redis: minutes, each
        with all its queues) from before
        ``rollup_cutoff(now)`` are added into their hourly rows and deleted, in one atomic write
        (so the totals never change), and up to ``limit`` hourly rows that start more than
        ``keep_days`` days before ``now`` are deleted. Returns the rows rolled up or deleted
        (``limit`` or more: call again)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no history")

    def schema_version(self) -> int | None:
        """The last schema migration applied to the store; None for a store without numbered
        migrations (the default)."""
        return None

    def reserve_connections(self, slots: int) -> list[str]:
        """A worker on this backend runs up to ``slots`` more tasks at once (fewer, if negative:
        it stopped). A store whose tasks may each hold a pooled connection (PostgreSQL's
        ``transaction()``) sizes its pool to match; the answer is warnings to log (a size the
        user fixed too small). Default: nothing to do."""
        return []

    def startup_warnings(self) -> list[str]:
        """Settings of the store that put acknowledged jobs at risk; a worker logs them at
        start."""
        return []

    # An optional hook: a backend without local waiters has nothing to do.
    def wake(self) -> None:  # noqa: B027
        """Wake this process's threads blocked in wait_for_jobs (used at shutdown)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. The backend must not be used afterwards."""
