"""The worker: claims jobs up to its free slots, runs them, heartbeats their leases, and
keeps the store tidy (reaping expired leases, promoting due jobs, pruning old results).

A worker holds nothing that cannot be lost. Killed at any instant, its jobs come back when
their leases expire; stopped with SIGTERM, it finishes what it can and releases the rest.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import contextvars
import functools
import logging
import os
import random
import re
import signal
import socket
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from . import faultpoints
from .app import Conveyor
from .backends.base import Backend, ClaimReply, Lease, LoopClaims, WorkerInfo
from .errors import ClaimLost, ConfigurationError, LeaseLost, StoreError
from .executor import Execution, Outcome
from .health import HeartbeatFile
from .job import Job, JobState
from .metrics import Metrics
from .payload import check_queue_name
from .redact import mask_text
from .retention import PruneOutcome, Pruner, next_pass_in, retention_rules
from .threads import TaskThreads

log = logging.getLogger("conveyor.worker")
ACK_BATCH = 256  # most acks written in one store transaction
# Held (prefetched) jobs a worker starts are reported started to the store (a heartbeat of their
# leases) at most this often: the store charges an attempt only for a job it knows started, so
# this bounds the time a job runs uncounted, for at most 1/MARK_SPACING_S writes a second.
MARK_SPACING_S = 0.1
# Exit code of a worker process that stopped because every slot was stuck (EX_TEMPFAIL: "try
# again"): a new process starts with free slots, which the hung threads cannot give back.
EXIT_STUCK = 75
T = TypeVar("T")
# A round of claims (Worker._claim_steps): yields (acks, queue, how many, how many start) per
# store call, is sent each call's (held, jobs), returns (held or None, every job claimed).
ClaimSteps = Generator[tuple[list[tuple[Lease, str | None]], str, int, int], ClaimReply,
                       tuple[list[bool] | None, list[Job]]]


def parse_queues(spec: str | Sequence[str] | Mapping[str, int]) -> dict[str, int]:
    """``"high:6,default:3,low:1"`` (or a list, or a dict) to ``{queue: weight}``."""
    items: list[tuple[str, int]] = []
    if isinstance(spec, Mapping):
        items = list(spec.items())
    else:
        parts = spec.split(",") if isinstance(spec, str) else list(spec)
        for raw in parts:
            part = raw.strip()
            if not part:
                continue
            name, _, weight = part.rpartition(":")
            if name and re.fullmatch(r"\s*-?[0-9]+\s*", weight):
                items.append((name.strip(), int(weight)))
            else:
                items.append((part, 1))  # no weight; the name itself may contain ':'
    if not items:
        raise ConfigurationError("no queues given: use e.g. --queues high:6,default:3,low:1")
    result: dict[str, int] = {}
    for queue, w in items:
        check_queue_name(queue)
        if w < 1:
            raise ConfigurationError(f"queue {queue!r} weight must be >= 1, got {w}")
        result[queue] = w
    return result


def plan_strict(free: int, weights: Mapping[str, int]) -> list[tuple[str, int]]:
    """Strict priority between queues: every slot to the heaviest queue (ties: listed order);
    only what it cannot use passes down to the next."""
    order = sorted(weights, key=lambda n: -weights[n])  # sorted() is stable: ties keep their order
    return [(name, free if i == 0 else 0) for i, name in enumerate(order)]


def plan_claims(free: int, weights: Mapping[str, int], rng: random.Random) -> list[tuple[str, int]]:
    """Split ``free`` slots across queues by weight, in a weighted random order.

    Each slot goes to a queue drawn by weight, so over time queues get slots in proportion to
    their weights even when only one slot frees at a time. The order matters because the
    worker hands a queue's unused share to the queues after it (work-conserving).
    """
    if len(weights) == 1:  # the usual case: nothing to draw (a weighted draw per claim cost 2-3 us)
        return [(name, free) for name in weights]
    names = list(weights)
    counts = Counter(rng.choices(names, [weights[n] for n in names], k=free))
    # Weighted shuffle: sort by u**(1/w) descending (Efraimidis-Spirakis).
    order = sorted(names, key=lambda n: rng.random() ** (1.0 / weights[n]), reverse=True)
    return [(name, counts[name]) for name in order]


@dataclass
class _Running:
    job: Job
    lease: Lease
    task: asyncio.Task[None] | None = None
    execution: Execution | None = None
    lost: bool = False
    finishing: bool = False  # the task is done; its outcome is being written
    freed: bool = False  # its slot went back when the task finished, before the outcome landed
    settled: bool = False  # the outcome was written (or refused): no more heartbeats
    acking: bool = False  # succeeded: its ack is queued or being written (then _acked settles it)
    held_at: float = 0.0  # when it was held for a slot (prefetch), time.monotonic()


def _completing(r: _Running) -> bool:
    """The task is committing, or has committed, its job's success in its own transaction()."""
    return r.execution is not None and r.execution.context is not None and r.execution.context.completing


@dataclass
class WorkerCounters:
    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    lease_lost: int = 0
    reaped: int = 0
    released: int = 0
    by_task: Counter[str] = field(default_factory=Counter)


class Worker:
    """Run jobs from ``queues`` with up to ``concurrency`` at a time.

    ``queues`` is ``"high:6,default:3,low:1"``, a list of names, or a dict of weights. Sync
    tasks run on a thread pool of ``concurrency`` threads, ``async def`` tasks on the loop.

    ``prefetch`` (default 0): claim up to this many jobs beyond the free slots and hold them,
    leased and heartbeated, to start the moment a slot frees; the next claim's round trip then
    overlaps running jobs instead of waiting between them. It pays for short jobs. The cost:
    a held job is this worker's (other workers cannot take it) and waits behind the running
    ones, and a job enqueued later, even a higher-priority one, can start only after the held
    ones. Leases, fencing and acks are unchanged; at stop, held jobs are released unrun. A held
    job is claimed as not started: if this worker dies before it starts, its lease runs out
    without costing it an attempt (a stall, see ``Job.stalls``). Once it starts, the next
    heartbeat says so (in the write it makes anyway): a worker killed in between leaves it a
    stall too, not an attempt.

    ``prefetch_hold`` (default 1 s): a held job that has waited this long for a slot (long jobs
    fill them all) is released back to its queue unrun, its attempt not counted, where an idle
    worker can take it; until a slot frees, this worker then claims no more than its free slots.
    So a held job never waits behind long ones for more than this.

    ``stuck_grace`` (default 60 s): a sync task that runs past its timeout is failed (or retried)
    at the timeout, but its thread cannot be killed and keeps the slot until the call returns:
    a stuck slot (``WorkerInfo.stuck``). When every slot has been stuck this long, the worker
    stops with ``exit_code`` EXIT_STUCK, so that its supervisor starts a fresh process.
    """

    def __init__(
        self,
        app: Conveyor,
        *,
        queues: str | Sequence[str] | Mapping[str, int] = "default",
        concurrency: int = 8,
        visibility_timeout: float | None = None,
        poll_interval: float = 1.0,
        grace_period: float = 30.0,
        maintenance_interval: float = 1.0,
        prune_interval: float = 60.0,
        worker_id: str | None = None,
        install_signal_handlers: bool = True,
        metrics: Metrics | None = None,
        strict: bool = False,
        scheduler: bool = True,
        prefetch: int = 0,
        prefetch_hold: float = 1.0,
        stuck_grace: float = 60.0,
        heartbeat_file: str | None = None,
    ) -> None:
        if concurrency < 1:
            raise ConfigurationError(f"concurrency must be >= 1, got {concurrency}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ConfigurationError(f"prefetch must be an int >= 0, got {prefetch!r}")
        if not prefetch_hold > 0:
            raise ConfigurationError(f"prefetch_hold must be > 0 seconds, got {prefetch_hold!r}")
        self.app = app
        self.weights = parse_queues(queues)
        self.strict = strict  # strict priority between queues instead of weighted sharing
        self.scheduler = scheduler  # run the app's cron schedules here too (safe in every worker)
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.prefetch_hold = float(prefetch_hold)
        self.lease_s = float(app.visibility_timeout if visibility_timeout is None else visibility_timeout)
        if not self.lease_s > 0:
            raise ConfigurationError(f"visibility_timeout must be > 0 seconds, got {visibility_timeout!r}")
        if not poll_interval > 0:
            raise ConfigurationError(f"poll_interval must be > 0 seconds, got {poll_interval!r}")
        if not grace_period >= 0:
            raise ConfigurationError(f"grace_period must be >= 0 seconds, got {grace_period!r}")
        if not stuck_grace > 0:
            raise ConfigurationError(f"stuck_grace must be > 0 seconds, got {stuck_grace!r}")
        if not maintenance_interval > 0:
            raise ConfigurationError(f"maintenance_interval must be > 0 seconds, got {maintenance_interval!r}")
        self.heartbeat_interval = self.lease_s / 3
        self.poll_interval = poll_interval
        self.grace_period = grace_period
        self.maintenance_interval = maintenance_interval
        self.prune_interval = prune_interval
        self.stuck_grace = float(stuck_grace)
        self.exit_code = 0  # what a process running only this worker should exit with (EXIT_STUCK)
        self.id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.install_signal_handlers = install_signal_handlers
        # Rewritten after each heartbeat, for a liveness probe (`conveyor health`; health.py).
        self.heartbeat_file = HeartbeatFile(heartbeat_file, worker_id=self.id, max_age=self.lease_s)
        self.metrics = metrics if metrics is not None else app.metrics
        self.counters = WorkerCounters()
        self.started_at = time.time()
        self._rng = random.Random()
        self._running: dict[int, _Running] = {}
        # Jobs whose attempt the claim's thread started (see _prepare), until _start takes them.
        self._prepared: dict[int, Execution] = {}
        self._context: contextvars.Context | None = None  # what tasks run in copies of
        self._busy = 0  # slots taken, including threads still running past a timeout
        self._stuck: list[int] = []  # job ids of those threads (a job hung twice here is in it twice)
        self._stuck_timer: asyncio.TimerHandle | None = None  # while every slot is stuck
        self._held: collections.deque[_Running] = collections.deque()  # claimed, waiting for a slot (prefetch)
        self._hold_timer: asyncio.TimerHandle | None = None  # for the longest held job (_hold_expired)
        self._prefetch_paused = False  # held jobs were given back for want of a slot; until one frees
        self._giving_back: set[asyncio.Task[None]] = set()  # releases of held jobs in flight
        self._unmarked: list[_Running] = []  # held jobs started here, not yet reported started
        self._marking: asyncio.Task[None] | None = None  # the task that reports them (_mark_started)
        self._loop_claims: LoopClaims | None = None
        # A claim sent ahead (see _send_ahead), not read yet: (what finish takes, the acks it
        # carries, the slots it asked for).
        self._ahead: tuple[Any, list[tuple[_Running, str | None]], int] | None = None
        self._stopping = False
        self._forced = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slot_freed: asyncio.Event | None = None
        self._ack_ready: asyncio.Event | None = None
        # Succeeded jobs whose ack is not written yet: each stays in _running (heartbeated)
        # until _acked settles it.
        self._acks: list[tuple[_Running, str | None]] = []
        # While the claim loop is about to claim (or waits for a slot, which a finishing job
        # frees just before it acks), acks ride with its next claim; when it is parked (idle,
        # backing off, stopped), the ack loop writes them on its own.
        self._claimer_parked = True
        self._stopped: asyncio.Event | None = None
        self._claim_s = 0.001  # a claim call's duration, a moving average
        self._acks_in_flight = 0  # jobs whose ack the ack loop is writing (their leases still stand)
        self._started = asyncio.Event()  # replaced in run_async
        self._on_started: list[Callable[[], None]] = []

    @property
    def backend(self) -> Backend:
        return self.app.backend

    @property
    def stopping(self) -> bool:
        """True once a stop was requested (it may change while the worker awaits)."""
        return self._stopping

    # -- public control ----------------------------------------------------------------
    def run(self) -> None:
        """Run until stopped (SIGTERM/SIGINT or ``stop()``)."""
        asyncio.run(self.run_async())

    def stop(self, *, graceful: bool = True) -> None:
        """Ask the worker to stop; safe from any thread. A second, or non-graceful, call hurries it."""
        loop = self._loop
        if loop is None or loop.is_closed():
            self._stopping = True
            self._forced = self._forced or not graceful
            return
        loop.call_soon_threadsafe(self._request_stop, graceful)

    def _request_stop(self, graceful: bool = True) -> None:
        if self._stopping or not graceful:
            if not self._forced and self._stopping:
                log.warning("second stop request: releasing running jobs now")
            self._forced = True
        if not self._stopping:
            log.info("worker %s stopping: no new jobs; waiting up to %gs for %d running",
                     self.id, self.grace_period, len(self._running))
        self._stopping = True
        self.backend.wake()
        if self._slot_freed:
            self._slot_freed.set()
        if self._stopped and self._forced:
            self._stopped.set()

    # -- main --------------------------------------------------------------------------
    async def run_async(self) -> None:
        """Run on the caller's event loop until stopped (``run`` makes a loop of its own)."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._slot_freed = asyncio.Event()
        self._stopped = asyncio.Event()
        self._ack_ready = asyncio.Event()
        # Separate threads so a slow claim never delays a heartbeat, and an idle wait blocks neither.
        self._store = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="conveyor-store")
        self._beat = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="conveyor-heartbeat")
        self._maint = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="conveyor-maintenance")
        # One thread more than slots: an idle worker waits for jobs on it, and starts the first
        # job it claims right there (see _wait_then_claim).
        self._pool = TaskThreads(self.concurrency + 1, loop)
        self._loop_claims = self.backend.loop_claims()
        if self.install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._request_stop)
        await self._call(self._store, self.backend.record_worker, self._info())
        self.heartbeat_file.beat(store_ok=True)
        for text in await self._call(self._store, self.backend.startup_warnings):
            log.warning("%s", text)
        log.info("worker %s started: queues %s, concurrency %d, lease %gs",
                 self.id, ",".join(f"{q}:{w}" for q, w in self.weights.items()), self.concurrency, self.lease_s)
        helpers = [
            loop.create_task(self._ack_loop(), name="conveyor-acks"),
            loop.create_task(self._heartbeat_loop(), name="conveyor-heartbeat"),
            loop.create_task(self._maintenance_loop(), name="conveyor-maintenance"),
            loop.create_task(self._prune_loop(), name="conveyor-prune"),
        ]
        if self.scheduler and self.app.schedules:
            helpers.append(loop.create_task(self._scheduler_loop(), name="conveyor-scheduler"))
        # Each slot's task may hold a pooled connection (transaction()): the pool makes room.
        for text in self.backend.reserve_connections(self.concurrency):
            log.warning("%s", text)
        self._started.set()
        for cb in self._on_started:
            cb()
        try:
            try:
                await self._claim_loop()
            finally:
                await self._drain()
        finally:
            if self._marking is not None:
                helpers.append(self._marking)
            for h in helpers:
                h.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            if self._stuck_timer is not None:
                self._stuck_timer.cancel()
            if self.install_signal_handlers:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            # A cancelled heartbeat's record_worker may still be running on its thread: let it
            # land first, or it writes the row back after remove_worker (a ghost worker). Not
            # when hurried by a second signal: then exiting now matters more.
            if not self._forced:
                await asyncio.to_thread(self._beat.shutdown, wait=True, cancel_futures=True)
            self.heartbeat_file.remove()
            try:
                await self._call(self._store, self.backend.remove_worker, self.id)
            except Exception:
                log.exception("could not remove worker row")
            for ex in (self._store, self._beat, self._maint):
                ex.shutdown(wait=False, cancel_futures=True)
            self.backend.reserve_connections(-self.concurrency)
            self._pool.shutdown()
            if self._stuck and self.metrics is not None:
                # The worker is gone: threads still hung are no longer anyone's slots.
                self.metrics.stuck_slots.dec(len(self._stuck))
            self._stuck.clear()
            if self._loop_claims is not None:
                self._loop_claims.close()
            log.info("worker %s stopped: %d succeeded, %d retried, %d dead, %d released",
                     self.id, self.counters.succeeded, self.counters.retried, self.counters.dead,
                     self.counters.released)

    async def _call(self, executor: concurrent.futures.Executor, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        assert self._loop is not None
        return await self._loop.run_in_executor(executor, lambda: fn(*args, **kw))

    def _info(self) -> WorkerInfo:
        return WorkerInfo(
            id=self.id, queues=list(self.weights), concurrency=self.concurrency, host=socket.gethostname(),
            pid=os.getpid(), started_at=self.started_at, last_seen=0.0,
            running=len(self._running) - len(self._held),  # held (prefetched) jobs are not running yet
            stuck=len(self._stuck),
        )

    async def _park(self, waiting: Awaitable[T]) -> T:
        """Wait on something that may take a while, handing any pending acks to the ack loop."""
        assert self._ack_ready is not None
        self._claimer_parked = True
        if self._acks:
            self._ack_ready.set()
        try:
            return await waiting
        finally:
            self._claimer_parked = False

    async def _claim_loop(self) -> None:
        try:
            await self._claim_until_stopped()
        finally:
            self._claimer_parked = True
            if self._acks and self._ack_ready is not None:
                self._ack_ready.set()

    async def _claim_until_stopped(self) -> None:
        assert self._slot_freed is not None
        self._claimer_parked = False
        self._context = contextvars.copy_context()
        queues = list(self.weights)
        woken, idle_claims = False, 0
        waited: list[Job] | None = None  # jobs the waiter claimed right after its wake-up
        backlog = False  # the last claim got all it asked for: more jobs are likely waiting
        gather_until = 0.0  # while gathering freed slots for one claim: until when
        while waited is not None or self._ahead is not None or not self._stopping:
            # (claimed jobs are started or released, a claim sent ahead included)
            free = self.concurrency + self._prefetch_now() - self._busy - len(self._held) - self._acks_in_flight
            if self._ahead is not None:
                asked = self._ahead[2]
                try:
                    jobs = await self._finish_ahead()
                except Exception:
                    log.exception("claim failed; retrying in %gs", self.poll_interval)
                    await self._park(asyncio.sleep(self.poll_interval))
                    continue
                backlog = len(jobs) >= asked
                if not jobs:
                    continue  # to the claim or the idle wait, from the top (with a waiter's jobs, if any)
            elif waited is None:
                # While held jobs keep the slots busy, claim in batches of half the prefetch or
                # more, not a job per round trip.
                if free <= 0 or (self._held and free < (self.prefetch + 1) // 2):
                    self._slot_freed.clear()
                    if self._acks:
                        # Acks that no claim will carry soon: the ack loop writes them meanwhile.
                        await self._park(self._slot_freed.wait())
                    else:
                        await self._slot_freed.wait()
                    continue
                if backlog and not self._held and free < (self.concurrency + 1) // 2:
                    # Jobs are waiting and most slots are still busy. Short jobs free their slots
                    # one after another; a claim per freed slot would pay a round trip (and on
                    # PostgreSQL a commit) per job. Wait up to about one claim round trip for
                    # half the slots, then claim them (and ack theirs) in one call.
                    now = time.monotonic()
                    if not gather_until:
                        gather_until = now + min(self._claim_s, 0.005)
                    if now < gather_until:
                        self._slot_freed.clear()
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._slot_freed.wait(), gather_until - now)
                        continue
                gather_until = 0.0
                if backlog and self._may_send_ahead():
                    # A batch of `concurrency` now, the next sent ahead once this reply is in
                    # (_send_ahead): Redis runs that claim while this one's jobs start here.
                    free = min(free, self.concurrency)
                try:
                    started = time.monotonic()
                    jobs = await self._claim(free)
                    # The time a claim takes (a moving average): how long gathering may wait.
                    self._claim_s += (time.monotonic() - started - self._claim_s) / 8
                except Exception:
                    log.exception("claim failed; retrying in %gs", self.poll_interval)
                    await self._park(asyncio.sleep(self.poll_interval))
                    continue
                backlog = len(jobs) >= free
            else:
                jobs, waited = waited, None
                backlog = False
            if jobs:
                faultpoints.hit("after_claim")
            if self.stopping and jobs:
                # Claimed while the stop came in: give them straight back, unrun (those the
                # claim's thread already started run on, as every running job does at a stop).
                for job in [j for j in jobs if j.id in self._prepared]:
                    self._start(job)
                leases = [Lease(j.id, j.lease_token) for j in jobs if j.lease_token and j.id not in self._running]
                if leases:
                    await self._release(leases, "job(s) claimed at stop")
                continue  # the loop ends, once a claim sent ahead is read and given back too
            for job in jobs:
                self._start(job)
            if jobs:
                # The wake-up is used: an empty claim after this one means the queue ran dry,
                # not that limits hold its jobs back.
                idle_claims, woken = 0, False
                # Let the jobs just started reach their threads before the next claim is made
                # (its store call would otherwise go first and hold them up).
                await asyncio.sleep(0)
                continue
            if woken:
                # Told there was work, yet the claim got none: concurrency or rate limits hold
                # the waiting jobs back. Back off instead of spinning on claims.
                # A job of ours finishing may have freed a concurrency slot: try again at once then.
                idle_claims += 1
                self._slot_freed.clear()
                with contextlib.suppress(TimeoutError):
                    await self._park(asyncio.wait_for(
                        self._slot_freed.wait(), min(0.005 * 2 ** min(idle_claims, 10), 0.25, self.poll_interval)))
            # The waiter's claim leaves out the slots of jobs whose ack is still being written:
            # they hold their leases until it lands, so the store never sees this worker hold
            # more than concurrency + prefetch jobs (a claim from here carries no acks).
            # (`free` has already left out those the ack loop is writing; the rest wait in _acks.)
            try:
                wait = functools.partial(self._wait_then_claim, queues, free - len(self._acks), self._startable())
                woken, waited = await self._park(self._pool.submit(wait).future)
            except Exception:
                log.exception("waiting for jobs failed")
                await self._park(asyncio.sleep(self.poll_interval))

    def _wait_then_claim(self, queues: list[str], free: int, startable: int) -> tuple[bool, list[Job] | None]:
        """On a task thread (one is free for it: the pool has one more than slots): wait for a
        wake-up, and claim on this thread at once, without a hop to the loop and on to a store
        thread and back (the latency of an idle worker); the first ``startable`` jobs claimed
        are started here too (see _prepare), the first of them on this very thread once this
        returns.
        The claim is the look at the store that tells a stale wake-up from real work. Returns
        (woken, the jobs claimed, or None if there was no claim to make)."""
        claims: list[tuple[str, int]] = []
        if free > 0 and not self._stopping:
            claims = plan_strict(free, self.weights) if self.strict else plan_claims(free, self.weights, self._rng)
        # A store that can make the claims in the wake-up's own round trip (Redis) does; with the
        # others this thread claims the moment the wake-up comes.
        woken, jobs = self.backend.wait_and_claim(queues, self.poll_interval, claims, worker_id=self.id,
                                                  lease_s=self.lease_s, start=startable)
        if not woken:
            return False, None
        if jobs is None:
            if self._stopping or free <= 0:
                return True, None
            try:
                _, jobs = self._claim_sync(free, [], startable)
            except Exception:
                log.exception("claim failed")
                return True, None  # the loop claims again
        if jobs:
            self._prepare(jobs, startable)
            return True, jobs
        # Nothing to claim: a stale wake-up, a job a neighbour took, or jobs that limits hold
        # back. A verified wait tells them apart: it returns at once only if jobs are waiting.
        return self.backend.wait_for_jobs(queues, self.poll_interval), None

    async def _claim(self, free: int) -> list[Job]:
        """A claim for ``free`` slots, from the loop where the store can (Backend.loop_claims),
        else on a store thread; pending acks ride with its first call."""
        batch, self._acks = self._acks[:ACK_BATCH], self._acks[ACK_BATCH:]
        startable = self._startable()
        near = self._loop_claims

        def claim() -> tuple[list[bool] | None, list[Job]]:
            held, jobs = self._claim_sync(free, batch, startable)
            self._prepare(jobs, startable)
            return held, jobs

        held: list[bool] | None
        try:
            if near is not None and not self._stopping:
                held, jobs = await self._claim_on_loop(near, free, batch, startable,
                                                       functools.partial(self._send_ahead, free))
                self._prepare(jobs, startable)
            else:
                held, jobs = await self._call(self._store, claim)
        except BaseException as exc:
            self._acks_back(batch, exc)
            raise
        if held is None:
            self._acks[:0] = batch  # no claim was made: they go with the next one
        else:
            self._acked_all(batch, held)
        return jobs

    async def _claim_on_loop(self, near: LoopClaims, free: int, acks: Sequence[tuple[_Running, str | None]],
                             startable: int, on_reply: Callable[[int], None]) -> tuple[list[bool] | None, list[Job]]:
        """_claim_sync's round, each store call awaited on the loop; what the loop cannot do
        without blocking (see LoopClaims) runs on a store thread. ``on_reply`` goes with a
        round of one call (one queue)."""
        steps = self._claim_steps(free, acks, startable)
        try:
            step = next(steps)
            while True:
                step_acks, queue, want, start = step
                try:
                    got = await near.ack_and_claim(step_acks, queue, want, worker_id=self.id, lease_s=self.lease_s,
                                                   wanted=self._claiming,
                                                   on_reply=on_reply if len(self.weights) == 1 else None,
                                                   start=start)
                    if callable(got):
                        got = await self._call(self._store, got)
                except Exception as exc:
                    step = steps.throw(exc)
                else:
                    step = steps.send(got)
        except StopIteration as done:
            result: tuple[list[bool] | None, list[Job]] = done.value
            return result

    def _may_send_ahead(self) -> bool:
        """Claims are sent ahead (see _send_ahead) on a store that claims from the loop, for one
        queue, and with prefetch of at least the concurrency: then a claim sent ahead takes a
        whole batch. (Without prefetch it could take only half the slots, and on Redis claims of
        four cost the store and the worker more per job than the overlap saved: measured.)"""
        return (self._loop_claims is not None and len(self.weights) == 1 and self.prefetch >= self.concurrency
                and not self._stopping)

    def _send_ahead(self, asked: int, got: int) -> None:
        """Called the moment a claim's reply is in (``got`` of the ``asked`` jobs), before it is
        read into jobs and they start: if the claim got all it asked for (more are likely
        waiting) and a batch of slots beyond those is free, as it is when short jobs finish
        within a round trip, send the next claim now, with the acks waiting. A busy worker's
        store calls were otherwise in series with the loop's own work (reading a reply, starting
        its jobs, taking their outcomes, then the next claim) while the store waited.
        A claim is sent ahead only after a claim that got jobs, so one is never left out while
        the worker waits idle: the loop reads it next."""
        near = self._loop_claims
        if near is None or self._ahead is not None or got < asked or not self._may_send_ahead():
            return
        batch_size = self.concurrency
        free = self.concurrency + self._prefetch_now() - self._busy - len(self._held) - self._acks_in_flight - asked
        if free < batch_size:
            return
        batch, self._acks = self._acks[:ACK_BATCH], self._acks[ACK_BATCH:]
        [queue] = self.weights
        sent = near.claim_ahead([(r.lease, result) for r, result in batch], queue, batch_size,
                                worker_id=self.id, lease_s=self.lease_s)
        if sent is None:
            self._acks[:0] = batch  # nothing was sent: they go with the next claim
            return
        self._ahead = (sent, batch, batch_size)

    async def _finish_ahead(self) -> list[Job]:
        """The jobs of the claim _send_ahead sent (its acks settled as _claim settles them)."""
        assert self._ahead is not None and self._loop_claims is not None
        sent, batch, asked = self._ahead
        self._ahead = None
        startable = self._startable()
        try:
            got = await self._loop_claims.finish(sent, on_reply=functools.partial(self._send_ahead, asked))
            if callable(got):
                got = await self._call(self._store, got)
        except BaseException as exc:
            self._acks_back(batch, exc)
            raise
        held, jobs = got
        if batch:
            faultpoints.hit("after_ack")
        self._prepare(jobs, startable)
        self._acked_all(batch, held)
        return jobs

    def _acks_back(self, batch: Sequence[tuple[_Running, str | None]], exc: BaseException) -> None:
        """After a failed claim: its acks go with the next one, unless the store settled them
        one by one already (ClaimLost), which sending them again would report as leases lost."""
        if isinstance(exc, ClaimLost) and len(exc.acks_held) == len(batch):
            self._acked_all(batch, exc.acks_held)
        else:
            self._acks[:0] = batch

    def _acked_all(self, batch: Sequence[tuple[_Running, str | None]], held: Sequence[bool]) -> None:
        for (running, _), ok in zip(batch, held, strict=True):
            self._acked(running, ok)

    def _claim_sync(self, free: int, acks: Sequence[tuple[_Running, str | None]],
                    startable: int) -> tuple[list[bool] | None, list[Job]]:
        """The claims of one round (see _claim_steps), made in turn on the calling (store or
        waiter) thread."""
        steps = self._claim_steps(free, acks, startable)
        backend = self.backend
        try:
            step = next(steps)
            while True:
                step_acks, queue, want, start = step
                try:
                    if step_acks:
                        got = backend.ack_and_claim(step_acks, queue, want, worker_id=self.id, lease_s=self.lease_s,
                                                    start=start)
                    else:
                        got = [], backend.claim(queue, want, worker_id=self.id, lease_s=self.lease_s, start=start)
                except Exception as exc:
                    step = steps.throw(exc)
                else:
                    step = steps.send(got)
        except StopIteration as done:
            result: tuple[list[bool] | None, list[Job]] = done.value
            return result

    def _claiming(self) -> bool:
        return not self._stopping

    def _claim_steps(self, free: int, acks: Sequence[tuple[_Running, str | None]], startable: int) -> ClaimSteps:
        """The claims of one round, as a plan its caller carries out (_claim_sync on a thread,
        _claim_on_loop on the loop): ``free`` slots split across the queues by weight, each
        queue's unused share passed on to the next (work-conserving). Yields (acks, queue, how
        many, how many of them start at once) for each store call (``acks`` go with the first
        one only, else it is a plain claim), and is sent that call's (held, jobs), or thrown its
        error. The first ``startable`` jobs of the round start (see _start); the rest are
        claimed held (prefetch), not counted as attempts until they start. Returns whether each
        ack was held (None if no claim was made), and the jobs claimed."""
        claimed: list[Job] = []
        held: list[bool] | None = None
        acked = False  # the acks were written: from now on this round must return, not raise
        carry = 0
        full: list[str] = []
        plan = plan_strict(free, self.weights) if self.strict else plan_claims(free, self.weights, self._rng)
        for queue, share in plan:
            want = share + carry
            if want <= 0 or self._stopping:
                continue
            start = max(startable - len(claimed), 0)
            try:
                if held is None and acks:
                    held, jobs = yield [(r.lease, result) for r, result in acks], queue, want, start
                    acked = True
                    faultpoints.hit("after_ack")
                else:
                    _, jobs = yield [], queue, want, start
                    if held is None:
                        held = []  # no acks to carry: a claim was made
            except Exception:
                if not claimed and not acked:
                    raise
                # Jobs claimed from earlier queues are ours now: run them, don't strand them.
                log.exception("claim on queue %s failed; running the %d job(s) already claimed",
                              queue, len(claimed))
                return held, claimed
            claimed.extend(jobs)
            carry = want - len(jobs)
            if len(jobs) == want:
                full.append(queue)
        # Slots left over after every queue had its turn go to the queues that still had work.
        for queue in full:
            if carry <= 0 or self._stopping:
                break
            try:
                _, jobs = yield [], queue, carry, max(startable - len(claimed), 0)
            except Exception:
                log.exception("claim on queue %s failed; running the %d job(s) already claimed",
                              queue, len(claimed))
                return held, claimed
            claimed.extend(jobs)
            carry -= len(jobs)
        return held, claimed

    def _startable(self) -> int:
        """How many jobs a claim made now may start the moment it returns, off the loop (see
        _prepare). While the claim runs, nothing else takes a slot: jobs are launched by the
        claim loop (which waits for this claim) and from _held (empty, or this is 0)."""
        return 0 if self._held or self._stopping else self.concurrency - self._busy

    def _prepare(self, jobs: Sequence[Job], startable: int) -> None:
        """Where a claim came back (a store thread, the idle waiter's task thread, or the loop
        itself with Backend.loop_claims): start the first ``startable`` jobs' attempts
        (a sync task is handed to a thread: on the idle wait's task thread, the first of them
        to that very thread, which runs it when the wait returns), so a job does not wait for the loop
        to take the claim's reply (a thread hop: a fifth of an idle worker's enqueue-to-start
        latency). The loop then launches them first thing (_start). A kill here is the same
        kill point as on the loop: the claim returned jobs."""
        if not jobs or startable <= 0:
            return
        faultpoints.hit("after_claim")
        for job in jobs[:startable]:
            if self._stopping:
                return  # the loop gives the rest back unrun
            execution = Execution(job, self.app.tasks, self._pool, self.backend, self.app.signer, self._context,
                                  max_result_bytes=self.app.max_result_bytes)
            try:
                # On a task thread (the idle wait's), the first sync task runs on it next.
                execution.prepare(here=True)
            except Exception:  # the loop's own start of the job meets it again and reports it
                log.exception("job %d: could not start it on the claim's thread", job.id)
                return
            self._prepared[job.id] = execution

    def _forget(self, running: _Running) -> None:
        """Drop a finished job from the jobs heartbeated, unless its id now names another job:
        ids repeat after a store's data loss, and the newer job must stay heartbeated."""
        if self._running.get(running.job.id) is running:
            del self._running[running.job.id]

    def _start(self, job: Job) -> None:
        assert job.lease_token is not None
        self.counters.claimed += 1
        running = _Running(job=job, lease=Lease(job.id, job.lease_token))
        self._running[job.id] = running  # heartbeated from now on, held or running
        running.execution = self._prepared.pop(job.id, None)
        if running.execution is not None:
            self._launch(running)  # already started; _startable kept it within concurrency
        elif self._busy < self.concurrency and not self._held:
            self._launch(running)
        else:
            running.held_at = time.monotonic()
            self._held.append(running)
            self._arm_hold_timer()

    def _launch(self, running: _Running) -> None:
        assert self._loop is not None
        self._busy += 1
        running.task = self._loop.create_task(self._run_job(running), name=f"conveyor-job-{running.job.id}")

    def _launch_held(self) -> None:
        """Start held (prefetched) jobs in the free slots; drop those whose lease was lost."""
        while self._held and self._busy < self.concurrency and not self._stopping:
            running = self._held.popleft()
            if running.lost or running.settled:
                self._drop_held(running)
                continue
            self._launch(running)
            self._unmarked.append(running)
        if self._unmarked and self._marking is None and self._loop is not None:
            self._marking = self._loop.create_task(self._mark_started(), name="conveyor-mark-started")

    async def _mark_started(self) -> None:
        """Tell the store that held jobs started here (a heartbeat of their leases marks them):
        until it knows, a lease that runs out on one gives it back uncounted, as a job that never
        started. Started jobs are reported together, at most every MARK_SPACING_S; a job that
        finished meanwhile needs nothing (its outcome counts the attempt)."""
        try:
            while self._unmarked:
                batch, self._unmarked = self._unmarked, []
                leases = [r.lease for r in batch if not (r.settled or r.lost or r.acking or r.finishing)]
                if leases:
                    try:
                        await self._call(self._beat, self.backend.heartbeat, leases, lease_s=self.lease_s)
                    except Exception as exc:  # the next heartbeat reports them
                        log.warning("could not report %d started job(s): %s", len(leases), exc)
                await asyncio.sleep(MARK_SPACING_S)
        finally:
            self._marking = None

    def _drop_held(self, running: _Running) -> None:
        """A held job that will not run here (its lease is gone, or it is given back): forget it."""
        running.settled = True
        self._forget(running)

    def _prefetch_now(self) -> int:
        return 0 if self._prefetch_paused else self.prefetch

    def _arm_hold_timer(self) -> None:
        """Time the longest held job (the deque's first: jobs are held and launched in order)."""
        if self._hold_timer is None and self._held and self._loop is not None:
            wait = self._held[0].held_at + self.prefetch_hold - time.monotonic()
            self._hold_timer = self._loop.call_later(max(0.0, wait), self._hold_expired)

    def _hold_expired(self) -> None:
        """Give back the held jobs that waited prefetch_hold for a slot: every slot is taken by
        longer jobs, and an idle worker could be running them. Without a pause this worker
        would claim them (or their neighbours) straight back into the same wait."""
        self._hold_timer = None
        if self._stopping or self._loop is None:
            return  # the stop gives back every held job itself
        now = time.monotonic()
        leases = []
        while self._held and now - self._held[0].held_at >= self.prefetch_hold:
            running = self._held.popleft()
            if not (running.lost or running.settled):
                leases.append(running.lease)
            self._drop_held(running)
        if leases:
            self._prefetch_paused = True
            task = self._loop.create_task(self._give_back(leases), name="conveyor-give-back")
            self._giving_back.add(task)
            task.add_done_callback(self._giving_back.discard)
        self._arm_hold_timer()

    async def _give_back(self, leases: list[Lease]) -> None:
        released = await self._release(leases, "held job(s)")
        if released:
            log.info("gave back %d prefetched job(s) held %gs without a free slot: %s",
                     len(released), self.prefetch_hold, released)

    async def _release(self, leases: list[Lease], what: str) -> list[int]:
        """Give ``leases`` back to the store unrun (attempt not counted); the ids released, or
        none if the store could not be reached (the leases then expire)."""
        try:
            released = await self._call(self._store, self.backend.release, leases)
        except Exception:
            log.exception("could not release %d %s; their leases expire in %gs", len(leases), what, self.lease_s)
            return []
        self.counters.released += len(released)
        return released

    async def _run_job(self, running: _Running) -> None:
        job = running.job
        execution = running.execution
        if execution is None:
            execution = Execution(job, self.app.tasks, self._pool, self.backend, self.app.signer, self._context,
                                  max_result_bytes=self.app.max_result_bytes)
            running.execution = execution
        self._job_log(logging.DEBUG, job, "started", "job %d %s attempt %d/%d started",
                      job.id, job.task, job.attempts, job.max_attempts)
        if self.metrics is not None and job.attempted_at is not None:
            self.metrics.lag_seconds.labels(job.queue).observe(max(0.0, job.attempted_at - job.run_at))
        started = time.perf_counter()
        try:
            outcome = await execution.run()
            running.finishing = True  # only its outcome is left to write
            if execution.thread is None or execution.thread.done():
                # The slot is free for the next job while this one's outcome is written (the
                # job counts as done only once that write is durable).
                running.freed = True
                self._free_slot()
            if self.metrics is not None:
                self.metrics.run_seconds.labels(job.queue, job.task).observe(time.perf_counter() - started)
            if outcome.kind == "succeeded":
                # Its ack is queued; _acked settles the job once the ack's write returns (the
                # job stays in _running, heartbeated, until then).
                faultpoints.hit("before_ack")
                running.acking = True
                self._acks.append((running, outcome.result))
                assert self._ack_ready is not None
                self._ack_ready.set()
                return
            await self._settle(running, outcome)
            running.settled = True  # before anything else runs: no heartbeat may count it lost now
        except asyncio.CancelledError:
            if not running.lost and not self._stopping:
                raise
        except Exception:
            log.exception("job %d: unexpected error in the worker", job.id)
        finally:
            if not running.acking:
                running.settled = True
                self._forget(running)
            thread = execution.thread
            if running.freed:
                pass
            elif thread is not None and not thread.done():
                # A sync task can't be stopped (timeout, lost lease, shutdown): its slot stays
                # busy until the thread returns, so capacity shown is capacity real.
                log.warning("job %d: its thread is still running (%s); the slot stays busy until it returns",
                            job.id, "lease lost" if running.lost else "timed out")
                self._stuck_changed(job.id, stuck=True)

                def returned(_: object, job_id: int = job.id) -> None:
                    if self._loop and not self._loop.is_closed():
                        self._loop.call_soon_threadsafe(self._unstuck, job_id)

                thread.add_done_callback(returned)
            else:
                self._free_slot()

    def _unstuck(self, job_id: int) -> None:
        """A thread that ran past its job's end returned: its slot is free again."""
        self._stuck_changed(job_id, stuck=False)
        self._free_slot()

    def _stuck_changed(self, job_id: int, *, stuck: bool) -> None:
        """Count a stuck slot in or out; while every slot is stuck, time stuck_grace."""
        if stuck:
            self._stuck.append(job_id)
        elif job_id in self._stuck:
            self._stuck.remove(job_id)
        else:
            return  # returned after the worker stopped (and stopped counting it)
        if self.metrics is not None:
            self.metrics.stuck_slots.inc(1 if stuck else -1)
        if len(self._stuck) < self.concurrency:
            if self._stuck_timer is not None:
                self._stuck_timer.cancel()
                self._stuck_timer = None
        elif self._stuck_timer is None and not self._stopping and self._loop is not None:
            self._stuck_timer = self._loop.call_later(self.stuck_grace, self._all_stuck)

    def _all_stuck(self) -> None:
        """Every slot stayed stuck for stuck_grace: this process can run nothing until a hung
        call returns, which may be never. Stop (the hung jobs were settled at their timeout; any
        held job is released as at every stop) and exit non-zero, for a fresh process."""
        self._stuck_timer = None
        if self._stopping:
            return
        self.exit_code = EXIT_STUCK
        log.error("worker %s: all %d slot(s) stuck for %gs on sync tasks running past their timeout "
                  "(jobs %s; threads cannot be killed); stopping with exit code %d so that its "
                  "supervisor starts a fresh process", self.id, len(self._stuck), self.stuck_grace,
                  sorted(set(self._stuck)), EXIT_STUCK)
        self._request_stop()

    def _free_slot(self) -> None:
        self._busy -= 1
        self._prefetch_paused = False
        if self._held:
            self._launch_held()
        if self._slot_freed is not None:
            self._slot_freed.set()

    def _job_log(self, level: int, job: Job, outcome: str, msg: str, *args: Any) -> None:
        if log.isEnabledFor(level):
            log.log(level, msg, *args, extra={
                "job_id": job.id, "task": job.task, "queue": job.queue, "attempt": job.attempts,
                "max_attempts": job.max_attempts, "outcome": outcome, "worker_id": self.id,
            })

    def _count(self, job: Job, outcome: str) -> None:
        self.counters.by_task[f"{job.task}:{outcome}"] += 1
        if self.metrics is not None:
            self.metrics.attempts.labels(job.queue, job.task, outcome).inc()

    async def _settle(self, running: _Running, outcome: Outcome) -> None:
        job, lease = running.job, running.lease
        if outcome.error is not None and outcome.error.kind == "timeout" and self.metrics is not None:
            self.metrics.timeouts.labels(job.queue, job.task).inc()
        try:
            if outcome.kind == "completed":
                self.counters.succeeded += 1
                self._count(job, "succeeded")
                self._job_log(logging.DEBUG, job, "succeeded", "job %d %s succeeded in its own transaction",
                              job.id, job.task)
            elif outcome.kind == "retry":
                assert outcome.error is not None
                state = await self._record(self.backend.retry, lease, outcome.error, delay=outcome.delay)
                if state is JobState.DEAD:
                    self.counters.dead += 1
                    self._count(job, "dead")
                    self._job_log(logging.ERROR, job, "dead",
                                  "job %d %s failed on its last attempt (%d/%d), now dead: %s",
                                  job.id, job.task, job.attempts, job.max_attempts, mask_text(outcome.error.message))
                else:
                    self.counters.retried += 1
                    self._count(job, "retried")
                    self._job_log(logging.WARNING, job, "retried",
                                  "job %d %s attempt %d/%d failed (%s), retry in %.2fs: %s",
                                  job.id, job.task, job.attempts, job.max_attempts, outcome.error.kind,
                                  outcome.delay, mask_text(outcome.error.message))
            else:
                assert outcome.error is not None
                await self._record(self.backend.kill, lease, outcome.error)
                self.counters.dead += 1
                self._count(job, "dead")
                self._job_log(logging.ERROR, job, "dead", "job %d %s is dead (%s): %s",
                              job.id, job.task, outcome.error.kind, mask_text(outcome.error.message))
        except LeaseLost:
            why = await self._why_lost(job)
            if why == "lease_lost":
                self.counters.lease_lost += 1
            self._count(job, why)
            self._job_log(logging.WARNING, job, why,
                          "job %d %s: outcome %r discarded, the lease was lost (%s)", job.id, job.task,
                          outcome.kind, "the job was cancelled" if why == "cancelled" else "the job is re-run")

    def _acked(self, running: _Running, ok: bool) -> None:
        """The store answered a job's ack: it succeeded (durably), or its lease was lost."""
        running.acking = False
        if running.settled:
            return
        running.settled = True
        self._forget(running)
        job = running.job
        if ok:
            self.counters.succeeded += 1
            self._count(job, "succeeded")
            self._job_log(logging.DEBUG, job, "succeeded", "job %d %s succeeded", job.id, job.task)
        elif not running.lost:  # (a heartbeat that found the lease lost counted it already)
            assert self._loop is not None
            self._loop.create_task(self._ack_refused(running))

    async def _ack_refused(self, running: _Running) -> None:
        job = running.job
        why = await self._why_lost(job)
        if why == "lease_lost":
            self.counters.lease_lost += 1
        self._count(job, why)
        self._job_log(logging.WARNING, job, why, "job %d %s: its success was discarded, the lease was lost (%s)",
                      job.id, job.task, "the job was cancelled" if why == "cancelled" else "the job is re-run")

    def _ack_failed(self, batch: Sequence[tuple[_Running, str | None]], exc: BaseException) -> None:
        for running, _ in batch:
            running.acking = False
            if not running.settled:
                running.settled = True
                self._forget(running)
                self._job_log(logging.ERROR, running.job, "ack_failed",
                              "job %d %s: could not record its success (%s); it runs again after its lease expires",
                              running.job.id, running.job.task, exc)

    async def _ack_loop(self) -> None:
        """Group commit: acks that arrive while a batch is being written go in the next one,
        so a busy worker pays one store write for many jobs and an idle one waits for none."""
        assert self._ack_ready is not None
        while True:
            await self._ack_ready.wait()
            self._ack_ready.clear()
            while self._acks and self._claimer_parked:
                batch, self._acks = self._acks[:ACK_BATCH], self._acks[ACK_BATCH:]
                # Their slots are free, but their leases stand until this write lands: the claim
                # loop counts them as taken meanwhile, or the store would see this worker hold
                # more than concurrency + prefetch jobs.
                self._acks_in_flight += len(batch)
                try:
                    held = await self._record(self.backend.ack_many, [(r.lease, result) for r, result in batch])
                    faultpoints.hit("after_ack")
                except Exception as exc:
                    self._ack_failed(batch, exc)
                    continue
                finally:
                    self._acks_in_flight -= len(batch)
                    if self._slot_freed is not None:
                        self._slot_freed.set()
                self._acked_all(batch, held)

    async def _record(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """Write a job's outcome, retrying a store that is briefly away (a restart, a killed
        connection) for as long as the lease could still be valid; then give up, and the
        job is re-run after its lease expires."""
        delay = 0.1
        deadline = time.monotonic() + self.lease_s
        while True:
            try:
                return await self._call(self._store, fn, *args, **kw)
            except StoreError as exc:
                if self._forced or time.monotonic() + delay > deadline:
                    raise
                log.warning("could not record a job outcome (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            held = [r for r in list(self._running.values())
                    if not r.settled and not r.lost and not _completing(r)]
            # Jobs still waiting for a slot; every other one has started, and this write says so.
            waiting = {r.job.id for r in self._held}
            try:
                lost = await self._call(self._beat, self.backend.heartbeat, [r.lease for r in held],
                                        lease_s=self.lease_s, held=waiting)
                await self._call(self._beat, self.backend.record_worker, self._info())
            except Exception:
                log.exception("heartbeat failed; leases run out in %gs unless it recovers", self.lease_s)
                self.heartbeat_file.beat(store_ok=False)
                continue
            self.heartbeat_file.beat(store_ok=True)
            for r in held:
                # Refused because the job is done, not because the lease was lost: its task
                # completed it in its own transaction, or its ack landed meanwhile (while an ack
                # is on its way, the ack's answer says whether the lease held: _acked).
                if r.job.id in lost and not r.settled and not r.acking and not _completing(r):
                    r.lost = True
                    self._stop_attempt(r)
                    if r.task is None and r in self._held:  # held, never started: nothing to stop
                        self._held.remove(r)
                        self._drop_held(r)
                    outcome = await self._why_lost(r.job)
                    if outcome == "lease_lost":
                        self.counters.lease_lost += 1
                        if self.metrics is not None:
                            self.metrics.leases_lost.labels(r.job.queue).inc()
                    self._count(r.job, outcome)
                    self._job_log(logging.WARNING, r.job, outcome, "job %d %s: %s; stopped it", r.job.id, r.job.task,
                                  "cancelled" if outcome == "cancelled" else "lease lost (expired or taken over)")

    @staticmethod
    def _stop_attempt(r: _Running) -> None:
        """Async tasks are cancelled; sync ones see ``current_job().cancelled`` turn True."""
        if r.execution is not None and r.execution.context is not None:
            r.execution.context.cancel()
        if r.task is not None:
            r.task.cancel()

    async def _why_lost(self, job: Job) -> str:
        """``cancelled`` if someone cancelled the job, else ``lease_lost``."""
        try:
            current = await self._call(self._maint, self.backend.get, job.id)
        except Exception:
            return "lease_lost"
        return "cancelled" if current is not None and current.state is JobState.CANCELLED else "lease_lost"

    async def _maintenance_loop(self) -> None:
        while True:
            await asyncio.sleep(self.maintenance_interval * self._rng.uniform(0.5, 1.5))
            try:
                # One worker of the fleet per interval (the store decides): every worker reaping
                # and promoting each second cost the store that work times the workers.
                if await self._call(self._maint, self.backend.maintenance_turn, self.maintenance_interval):
                    await self._reap_and_promote()
            except Exception:
                log.exception("maintenance failed")

    async def _reap_and_promote(self) -> None:
        reaped = await self._call(self._maint, self.backend.reap, limit=1000)
        if reaped.count:
            self.counters.reaped += reaped.count
            if self.metrics is not None:
                self.metrics.reaped.labels("requeued").inc(len(reaped.requeued))
                self.metrics.reaped.labels("dead").inc(len(reaped.dead))
            log.warning("reaped %d expired lease(s): %d back to available, %d dead",
                        reaped.count, len(reaped.requeued), len(reaped.dead))
        await self._call(self._maint, self.backend.promote, limit=1000)

    async def _prune_loop(self) -> None:
        """Retention (see retention.py), beside reaping and promoting so that a long pass
        never holds them up. Passes come every ``prune_interval`` at most, sooner when jobs
        finish faster than a batch per interval."""
        pruner = Pruner(self.backend, retention_rules(self.app))
        call = functools.partial(self._call, self._maint)
        # At a random point of the first interval: workers started together spread out.
        await asyncio.sleep(self.prune_interval * self._rng.uniform(0, 1))
        last = time.monotonic()
        while True:
            started = time.monotonic()
            try:
                outcome = await pruner.run(call=call)
            except Exception:
                log.exception("pruning failed")
                outcome = PruneOutcome()
            if outcome.deleted:
                log.debug("pruned %d finished job(s)", outcome.deleted)
            delay = next_pass_in(outcome, started - last, batch=pruner.batch,
                                 shortest=self.maintenance_interval, longest=self.prune_interval)
            last = started
            await asyncio.sleep(delay)

    async def _scheduler_loop(self) -> None:
        from .cron import Scheduler

        scheduler = Scheduler(self.app, self.backend)
        log.info("scheduler on: %d cron schedule(s)", len(self.app.schedules))
        while True:
            try:
                await self._call(self._maint, scheduler.run_pending)
            except Exception:
                log.exception("cron scheduler failed; trying again")
            # A check every ~0.5 s keeps minute ticks on time and per-second (6-field) ones close.
            await asyncio.sleep(self._rng.uniform(0.25, 0.75))

    async def _drain(self) -> None:
        """After stop: wait for running jobs up to the grace period, then release the rest."""
        assert self._stopped is not None
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None
        if self._giving_back:
            await asyncio.wait(list(self._giving_back))
        tasks = [r.task for r in self._running.values() if r.task is not None]
        if tasks and not self._forced:
            stopper = asyncio.ensure_future(self._stopped.wait())
            deadline = time.monotonic() + self.grace_period
            while not self._forced and any(not t.done() for t in tasks):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                await asyncio.wait([*[t for t in tasks if not t.done()], stopper], timeout=left,
                                   return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
        # Jobs whose task finished are only writing their outcome: let that land (the ack
        # loop still runs) rather than release work that is done.
        finishing = [r.task for r in self._running.values() if r.finishing and not r.settled and r.task]
        if finishing:
            await asyncio.wait(finishing, timeout=min(5.0, self.lease_s))
        ack_deadline = time.monotonic() + min(5.0, self.lease_s)
        while any(r.acking for r in self._running.values()) and time.monotonic() < ack_deadline:
            await asyncio.sleep(0.005)  # the ack loop writes them (the claim loop has stopped)
        left_over = [r for r in self._running.values() if not r.settled and not r.finishing]
        if not left_over:
            return
        for r in left_over:
            r.lost = True  # tell _run_job the cancel is ours
            self._stop_attempt(r)
        released = await self._release([r.lease for r in left_over], "job(s) still running at shutdown")
        if released:
            log.warning("released %d job(s) still running at shutdown: %s", len(released), released)
        await asyncio.gather(*[r.task for r in left_over if r.task is not None], return_exceptions=True)
