"""Writing outcomes: acks in groups (each a success), retries and kills, releases; and
settling each job once the store has answered (River's job completer).

Words: a job is *acked* (its success written, usually with others in one store call), its
failure is *written* (a retry or a kill), it is *released* (given back unrun), and it is
*settled* once this worker is done with it, whatever the store answered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, assert_never

from .. import faultpoints
from ..backends.base import Lease
from ..errors import ClaimLost, LeaseLost, StoreError
from ..executor import Outcome, OutcomeKind
from ..history import DEAD, FAILED, PROCESSED
from ..job import Job, JobState
from ..redact import mask_text
from .capacity import Running, RunPhase

if TYPE_CHECKING:
    from . import Worker

log = logging.getLogger("conveyor.worker")
T = TypeVar("T")
ACK_BATCH = 256  # most acks written in one store transaction
# The outcomes the history counts (a lost lease or a cancel is no outcome of the attempt's own).
HISTORY_SLOTS = {"succeeded": PROCESSED, "retried": FAILED, "dead": DEAD}
Acks = Sequence[tuple[Running, "str | None"]]  # succeeded jobs and their results (JSON)


def log_job(w: Worker, level: int, job: Job, outcome: str, msg: str, *args: Any) -> None:
    """Log a line about one job, with the job's fields for structured logs."""
    if log.isEnabledFor(level):
        log.log(level, msg, *args, extra={
            "job_id": job.id, "task": job.task, "queue": job.queue, "attempt": job.attempts,
            "max_attempts": job.max_attempts, "outcome": outcome, "worker_id": w.id,
        })


def count(w: Worker, job: Job, outcome: str, run_s: float = 0.0) -> None:
    """Count a finished attempt by task and outcome (and in the metrics and the history)."""
    w.counters.by_task[f"{job.task}:{outcome}"] += 1
    if w.metrics is not None:
        w.metrics.attempts.labels(job.queue, job.task, outcome).inc()
    slot = HISTORY_SLOTS.get(outcome)
    if slot is not None:
        wait = job.attempted_at - job.run_at if job.attempted_at is not None else 0.0
        w.history.note(job.queue, slot, max(0.0, wait), run_s)


class Completer:
    """Acks succeeded jobs in groups, writes failures, and settles jobs on the store's answer."""

    def __init__(self, w: Worker) -> None:
        self.w = w
        # Succeeded jobs whose ack is not written yet: each stays heartbeated until its ack's
        # answer settles it. They ride with the next claim, or the ack loop writes them.
        self.queued: list[tuple[Running, str | None]] = []
        self.ready: asyncio.Event | None = None  # set in Worker.run_async

    # -- acks --------------------------------------------------------------------------
    def ack(self, running: Running, result: str | None) -> None:
        """Queue a succeeded job's ack."""
        running.move(RunPhase.ACKING)
        self.queued.append((running, result))
        if self.w.claimer.parked:
            # Otherwise the claim loop's next claim carries it, and a wake-up of the ack loop
            # (a task step per job, to find the claim loop busy) would be spent for nothing;
            # the claim loop wakes the ack loop itself when it parks with acks queued.
            assert self.ready is not None
            self.ready.set()

    def take(self) -> list[tuple[Running, str | None]]:
        """The next batch of queued acks, for one store call."""
        batch, self.queued = self.queued[:ACK_BATCH], self.queued[ACK_BATCH:]
        return batch

    def put_back(self, batch: list[tuple[Running, str | None]]) -> None:
        """Acks that were taken but not sent: they go first in the next call."""
        self.queued[:0] = batch

    async def ack_loop(self) -> None:
        """Group commit: acks that arrive while a batch is being written go in the next one,
        so a busy worker pays one store write for many jobs and an idle one waits for none.
        While the claim loop is about to claim, acks ride with its claim instead."""
        w = self.w
        capacity = w.capacity
        assert self.ready is not None
        while True:
            await self.ready.wait()
            self.ready.clear()
            while self.queued and w.claimer.parked:
                batch = self.take()
                # Their slots are free, but their leases stand until this write lands: the
                # free-slot rule counts them as taken meanwhile.
                capacity.writing_acks += len(batch)
                try:
                    held = await self.write(w.backend.ack_many,
                                            [(r.lease, result) for r, result in batch])
                    faultpoints.hit("after_ack")
                except Exception as exc:
                    self.acks_failed(batch, exc)
                    continue
                finally:
                    capacity.writing_acks -= len(batch)
                    if capacity.slot_freed is not None:
                        capacity.slot_freed.set()
                self.acks_done(batch, held)

    def acks_done(self, batch: Acks, held: Sequence[bool]) -> None:
        """The store answered a batch of acks: for each, whether the lease held."""
        for (running, _), ok in zip(batch, held, strict=True):
            self.ack_done(running, ok)

    def ack_done(self, running: Running, ok: bool) -> None:
        """The store answered a job's ack: it succeeded (durably), or its lease was lost."""
        if running.settled:
            return
        self.settle(running)
        w = self.w
        job = running.job
        if ok:
            w.counters.succeeded += 1
            count(w, job, "succeeded", running.run_s)
            log_job(w, logging.DEBUG, job, "succeeded", "job %d %s succeeded", job.id, job.task)
        elif not running.lost:  # (a heartbeat that found the lease lost counted it already)
            assert w._loop is not None
            w._loop.create_task(self.ack_refused(running))

    async def ack_refused(self, running: Running) -> None:
        w = self.w
        job = running.job
        why = await w.leases.why_lost(job)
        if why == "lease_lost":
            w.counters.lease_lost += 1
        count(w, job, why)
        log_job(w, logging.WARNING, job, why,
                "job %d %s: its success was discarded, the lease was lost (%s)", job.id, job.task,
                "the job was cancelled" if why == "cancelled" else "the job is re-run")

    def acks_failed(self, batch: Acks, exc: BaseException) -> None:
        """A batch of acks could not be written: the jobs run again when their leases expire."""
        for running, _ in batch:
            if not running.settled:
                self.settle(running)
                log_job(self.w, logging.ERROR, running.job, "ack_failed",
                        "job %d %s: could not record its success (%s); it runs again after its "
                        "lease expires", running.job.id, running.job.task, exc)

    def acks_not_sent(self, batch: list[tuple[Running, str | None]], exc: BaseException) -> None:
        """After a failed claim: its acks go with the next one, unless the store settled them
        one by one already (ClaimLost), which sending them again would report as leases lost."""
        if isinstance(exc, ClaimLost) and len(exc.acks_held) == len(batch):
            self.acks_done(batch, exc.acks_held)
        else:
            self.put_back(batch)

    # -- failures ----------------------------------------------------------------------
    async def write_outcome(self, running: Running, outcome: Outcome) -> None:
        """Write an outcome other than success: a retry or a kill (or nothing, for a job its
        task completed in its own transaction)."""
        w = self.w
        job, lease = running.job, running.lease
        error = outcome.error
        if error is not None and error.kind == "timeout" and w.metrics is not None:
            w.metrics.timeouts.labels(job.queue, job.task).inc()
        kind = outcome.kind
        try:
            if kind is OutcomeKind.COMPLETED:
                w.counters.succeeded += 1
                count(w, job, "succeeded", running.run_s)
                log_job(w, logging.DEBUG, job, "succeeded",
                        "job %d %s succeeded in its own transaction", job.id, job.task)
            elif kind is OutcomeKind.RETRY:
                assert error is not None
                state = await self.write(w.backend.retry, lease, error, delay=outcome.delay)
                if state is JobState.DEAD:
                    w.counters.dead += 1
                    count(w, job, "dead", running.run_s)
                    log_job(w, logging.ERROR, job, "dead",
                            "job %d %s failed on its last attempt (%d/%d), now dead: %s",
                            job.id, job.task, job.attempts, job.max_attempts,
                            mask_text(error.message))
                else:
                    w.counters.retried += 1
                    count(w, job, "retried", running.run_s)
                    log_job(w, logging.WARNING, job, "retried",
                            "job %d %s attempt %d/%d failed (%s), retry in %.2fs: %s",
                            job.id, job.task, job.attempts, job.max_attempts, error.kind,
                            outcome.delay, mask_text(error.message))
            elif kind is OutcomeKind.DEAD:
                assert error is not None
                await self.write(w.backend.kill, lease, error)
                w.counters.dead += 1
                count(w, job, "dead", running.run_s)
                log_job(w, logging.ERROR, job, "dead", "job %d %s is dead (%s): %s",
                        job.id, job.task, error.kind, mask_text(error.message))
            elif kind is OutcomeKind.SUCCEEDED:
                raise AssertionError("a success is acked (Completer.ack), not written here")
            else:
                assert_never(kind)
        except LeaseLost:
            why = await w.leases.why_lost(job)
            if why == "lease_lost":
                w.counters.lease_lost += 1
            count(w, job, why)
            log_job(w, logging.WARNING, job, why,
                    "job %d %s: outcome %r discarded, the lease was lost (%s)", job.id, job.task,
                    outcome.kind.value,
                    "the job was cancelled" if why == "cancelled" else "the job is re-run")

    async def write(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """Write a job's outcome, retrying a store that is briefly away (a restart, a killed
        connection) for as long as the lease could still be valid; then give up, and the
        job is re-run after its lease expires."""
        w = self.w
        delay = 0.1
        deadline = time.monotonic() + w.lease_s
        while True:
            try:
                return await w._call(w._store, fn, *args, **kw)
            except StoreError as exc:
                if w._forced or time.monotonic() + delay > deadline:
                    raise
                log.warning("could not record a job outcome (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def release(self, leases: list[Lease], what: str) -> list[int]:
        """Give ``leases`` back to the store unrun (attempt not counted); the ids released, or
        none if the store could not be reached (the leases then expire)."""
        w = self.w
        try:
            released = await w._call(w._store, w.backend.release, leases)
        except Exception:
            log.exception("could not release %d %s; their leases expire in %gs",
                          len(leases), what, w.lease_s)
            return []
        w.counters.released += len(released)
        return released

    def settle(self, running: Running) -> None:
        """This worker is done with the job: no more heartbeats."""
        running.move(RunPhase.SETTLED)
        self.w.leases.forget(running)
