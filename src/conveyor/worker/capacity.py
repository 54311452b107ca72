"""Slots: the one free-slot rule, the jobs held for a slot (prefetch), stuck slots, and the
phase each job this worker holds a lease on is in."""

from __future__ import annotations

import asyncio
import collections
import enum
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..backends.base import Lease
from ..executor import Execution
from ..job import Job

if TYPE_CHECKING:
    from . import Worker

log = logging.getLogger("conveyor.worker")
# Exit code of a worker process that stopped because every slot was stuck (EX_TEMPFAIL: "try
# again"): a new process starts with free slots, which the hung threads cannot give back.
EXIT_STUCK = 75


class RunPhase(enum.Enum):
    """Where a leased job is in this worker. Every phase but SETTLED is heartbeated."""

    CLAIMED = "claimed"  # leased here, its task not started: held for a slot, or starting now
    RUNNING = "running"  # its task runs in a slot
    FINISHING = "finishing"  # the task is done; its outcome (retry, kill) is being written
    ACKING = "acking"  # it succeeded: its ack is queued or being written
    SETTLED = "settled"  # outcome written or refused, or dropped unrun: nothing more to do

    # Members are singletons compared by identity: hash them so too. Enum's own __hash__ is a
    # Python call, and every move of every job hashes two phases.
    __hash__ = object.__hash__


_P = RunPhase
# The legal moves. SETTLED -> SETTLED is allowed: a held job whose lease was lost is dropped
# both where the loss is found and where it would have started, and settling twice is harmless.
_MOVES: dict[RunPhase, frozenset[RunPhase]] = {
    _P.CLAIMED: frozenset({_P.RUNNING, _P.SETTLED}),
    _P.RUNNING: frozenset({_P.FINISHING, _P.SETTLED}),
    _P.FINISHING: frozenset({_P.ACKING, _P.SETTLED}),
    _P.ACKING: frozenset({_P.SETTLED}),
    _P.SETTLED: frozenset({_P.SETTLED}),
}


@dataclass
class Running:
    """A job this worker holds a lease on, from its claim until it is settled."""

    job: Job
    lease: Lease
    # Done once its run is over: its asyncio Task, or a stand-in for one (runner._SyncRun).
    task: asyncio.Future[None] | None = None
    execution: Execution | None = None
    phase: RunPhase = RunPhase.CLAIMED
    # Not a phase but a flag beside it: the lease was found lost (or the stop took the job
    # back). That happens in any phase before SETTLED (held, running, or writing a retry) and
    # the phase still moves on from there. It tells our cancellation from the task's own, and
    # says the loss was counted already.
    lost: bool = False
    held_at: float = 0.0  # when it was held for a slot (prefetch), time.monotonic()
    started: float = 0.0  # when its run began here, time.perf_counter()
    run_s: float = 0.0  # how long its task ran, once it has (for the history)

    def move(self, to: RunPhase) -> None:
        if to not in _MOVES[self.phase]:
            raise AssertionError(f"job {self.job.id}: no move from {self.phase.name} to {to.name}")
        self.phase = to

    @property
    def settled(self) -> bool:
        """The outcome was written (or refused), or the job was dropped: no more heartbeats."""
        return self.phase is RunPhase.SETTLED

    @property
    def acking(self) -> bool:
        """It succeeded, and its ack is queued or being written (the ack's answer settles it)."""
        return self.phase is RunPhase.ACKING

    @property
    def unfinished(self) -> bool:
        """Its task has not ended: held, starting or running."""
        return self.phase is RunPhase.CLAIMED or self.phase is RunPhase.RUNNING

    @property
    def writing(self) -> bool:
        """Its task ended, and its outcome is on its way to the store."""
        return self.phase is RunPhase.FINISHING or self.phase is RunPhase.ACKING

    @property
    def completing(self) -> bool:
        """The task is committing, or has committed, its job's success in its own
        transaction(): from then on its lease is no longer the worker's concern."""
        execution = self.execution
        return (execution is not None and execution.context is not None
                and execution.context.completing)

    def stop(self) -> None:
        """Stop its attempt: async tasks are cancelled; sync ones see
        ``current_job().cancelled`` turn True."""
        if self.execution is not None and self.execution.context is not None:
            self.execution.context.cancel()
        if self.task is not None:
            self.task.cancel()


class Capacity:
    """The worker's slots: how many are free, the jobs held for one, and the stuck ones."""

    def __init__(self, w: Worker) -> None:
        self.w = w
        self.concurrency = w.concurrency
        self.prefetch = w.prefetch
        self.busy = 0  # slots taken, including threads still running past a timeout
        # Succeeded jobs whose ack the ack loop is writing: their leases stand until it lands.
        self.writing_acks = 0
        self.held: collections.deque[Running] = collections.deque()  # waiting for a slot
        self.hold_timer: asyncio.TimerHandle | None = None  # for the longest held job
        self.paused = False  # held jobs were given back for want of a slot; until one frees
        self.giving_back: set[asyncio.Task[None]] = set()  # releases of held jobs in flight
        self.stuck: list[int] = []  # job ids of threads past their timeout (a job twice: twice)
        self.stuck_timer: asyncio.TimerHandle | None = None  # while every slot is stuck
        self.slot_freed: asyncio.Event | None = None  # set in Worker.run_async

    def free(self) -> int:
        """How many jobs a claim may take now: the slots and the prefetch room, less every job
        this worker holds a lease on and has not settled: running (stuck threads included),
        held, and succeeded ones whose ack is being written. (Acks still queued ride with the
        claim itself.) So the store never sees this worker hold more than concurrency +
        prefetch jobs."""
        prefetch = 0 if self.paused else self.prefetch
        return self.concurrency + prefetch - self.busy - len(self.held) - self.writing_acks

    def startable(self) -> int:
        """How many jobs a claim made now may start the moment it returns, off the loop (see
        Runner.start_early). While the claim runs, nothing else takes a slot: jobs are started
        by the claim loop (which waits for this claim) and from ``held`` (empty, or this is 0)."""
        return 0 if self.held or self.w.stopping else self.concurrency - self.busy

    def has_slot(self) -> bool:
        """A slot is free for a job that was just claimed (held jobs go first)."""
        return self.busy < self.concurrency and not self.held

    def hold(self, running: Running) -> None:
        running.held_at = time.monotonic()
        self.held.append(running)
        self.arm_hold_timer()

    def start_held(self) -> None:
        """Start held (prefetched) jobs in the free slots; drop those whose lease was lost."""
        w = self.w
        while self.held and self.busy < self.concurrency and not w.stopping:
            running = self.held.popleft()
            if running.lost or running.settled:
                w.completer.settle(running)
                continue
            w.runner.start(running)
            w.leases.unreported.append(running)
        w.leases.report_started_soon()

    def free_slot(self) -> None:
        self.busy -= 1
        self.paused = False
        if self.held:
            self.start_held()
        if self.slot_freed is not None:
            self.slot_freed.set()

    # -- held jobs that wait too long --------------------------------------------------
    def arm_hold_timer(self) -> None:
        """Time the longest held job (the deque's first: jobs are held and started in order)."""
        loop = self.w._loop
        if self.hold_timer is None and self.held and loop is not None:
            wait = self.held[0].held_at + self.w.prefetch_hold - time.monotonic()
            self.hold_timer = loop.call_later(max(0.0, wait), self.hold_expired)

    def hold_expired(self) -> None:
        """Give back the held jobs that waited prefetch_hold for a slot: every slot is taken by
        longer jobs, and an idle worker could be running them. Without a pause this worker
        would claim them (or their neighbours) straight back into the same wait."""
        w = self.w
        self.hold_timer = None
        loop = w._loop
        if w.stopping or loop is None:
            return  # the stop gives back every held job itself
        now = time.monotonic()
        leases = []
        while self.held and now - self.held[0].held_at >= w.prefetch_hold:
            running = self.held.popleft()
            if not (running.lost or running.settled):
                leases.append(running.lease)
            w.completer.settle(running)
        if leases:
            self.paused = True
            task = loop.create_task(self.give_back(leases), name="conveyor-give-back")
            self.giving_back.add(task)
            task.add_done_callback(self.giving_back.discard)
        self.arm_hold_timer()

    async def give_back(self, leases: list[Lease]) -> None:
        released = await self.w.completer.release(leases, "held job(s)")
        if released:
            log.info("gave back %d prefetched job(s) held %gs without a free slot: %s",
                     len(released), self.w.prefetch_hold, released)

    # -- stuck slots -------------------------------------------------------------------
    def unstuck(self, job_id: int) -> None:
        """A thread that ran past its job's end returned: its slot is free again."""
        self.stuck_changed(job_id, stuck=False)
        self.free_slot()

    def stuck_changed(self, job_id: int, *, stuck: bool) -> None:
        """Count a stuck slot in or out; while every slot is stuck, time stuck_grace."""
        w = self.w
        if stuck:
            self.stuck.append(job_id)
        elif job_id in self.stuck:
            self.stuck.remove(job_id)
        else:
            return  # returned after the worker stopped (and stopped counting it)
        if w.metrics is not None:
            w.metrics.stuck_slots.inc(1 if stuck else -1)
        if len(self.stuck) < self.concurrency:
            if self.stuck_timer is not None:
                self.stuck_timer.cancel()
                self.stuck_timer = None
        elif self.stuck_timer is None and not w.stopping and w._loop is not None:
            self.stuck_timer = w._loop.call_later(w.stuck_grace, self.all_stuck)

    def all_stuck(self) -> None:
        """Every slot stayed stuck for stuck_grace: this process can run nothing until a hung
        call returns, which may be never. Stop (the hung jobs were settled at their timeout;
        any held job is released as at every stop) and exit non-zero, for a fresh process."""
        w = self.w
        self.stuck_timer = None
        if w.stopping:
            return
        w.exit_code = EXIT_STUCK
        log.error("worker %s: all %d slot(s) stuck for %gs on sync tasks running past their "
                  "timeout (jobs %s; threads cannot be killed); stopping with exit code %d so "
                  "that its supervisor starts a fresh process", w.id, len(self.stuck),
                  w.stuck_grace, sorted(set(self.stuck)), EXIT_STUCK)
        w._request_stop()
