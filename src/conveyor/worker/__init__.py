"""The worker: claims jobs up to its free slots, runs them, heartbeats their leases, and
keeps the store tidy (reaping expired leases, promoting due jobs, pruning old results).

A worker holds nothing that cannot be lost. Killed at any instant, its jobs come back when
their leases expire; stopped with SIGTERM, it finishes what it can and releases the rest.

One room per concern: ``capacity`` (the free-slot rule, held jobs, stuck slots, each job's
RunPhase), ``claimer`` (the claim loop and its planning), ``runner`` (starting and running
claimed jobs), ``completer`` (acks in groups, retries, kills), ``leases`` (heartbeat, lost
leases) and ``maintenance`` (reap, promote, prune, cron). The Worker here holds the
configuration and wires them together: run, stop, signals, the drain at stop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import os
import random
import signal
import socket
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..app import Conveyor
from ..backends.base import Backend, WorkerInfo
from ..errors import ConfigurationError
from ..health import HeartbeatFile
from ..history import FLUSH_S, Recorder
from ..hooks import HookEvent
from ..metrics import Metrics
from ..threads import TaskThreads
from .capacity import EXIT_STUCK, Capacity, Running, RunPhase
from .claimer import Claimer, ClaimSteps, parse_queues, plan_claims, plan_strict
from .completer import ACK_BATCH, Completer
from .leases import MARK_SPACING_S, Leases
from .maintenance import Maintenance
from .runner import Runner

__all__ = [
    "ACK_BATCH", "EXIT_STUCK", "MARK_SPACING_S", "ClaimSteps", "RunPhase", "Running", "Worker",
    "WorkerCounters", "parse_queues", "plan_claims", "plan_strict",
]

log = logging.getLogger("conveyor.worker")
T = TypeVar("T")


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

    ``burst`` (RQ's ``--burst``): stop once the queues have no available or due job and this
    worker's own jobs have finished (what they enqueued included). Jobs scheduled for later,
    retries in their backoff among them, do not keep it running.

    ``stuck_grace`` (default 60 s): a sync task that runs past its timeout is failed (or retried)
    at the timeout, but its thread cannot be killed and keeps the slot until the call returns:
    a stuck slot (``WorkerInfo.stuck``). When every slot has been stuck this long, the worker
    stops with ``exit_code`` EXIT_STUCK, so that its supervisor starts a fresh process.

    ``history_interval`` (default 12 s): how often the outcomes this worker counted are added to
    the store's history (conveyor/history.py), in one write; also at stop. A kill loses what
    was counted since the last one.
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
        burst: bool = False,
        history_interval: float = FLUSH_S,
    ) -> None:
        if concurrency < 1:
            raise ConfigurationError(f"concurrency must be >= 1, got {concurrency}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ConfigurationError(f"prefetch must be an int >= 0, got {prefetch!r}")
        if not prefetch_hold > 0:
            raise ConfigurationError(f"prefetch_hold must be > 0 seconds, got {prefetch_hold!r}")
        self.app = app
        app.import_includes()  # the tasks of other modules register before any job is claimed
        self.weights = parse_queues(queues)
        self.strict = strict  # strict priority between queues instead of weighted sharing
        self.scheduler = scheduler  # run the app's cron schedules here too (safe in every worker)
        if self.scheduler and self.app.schedules and "cron" in self.backend.missing:
            # Refused at once: ticks nobody records would fire on every worker.
            from ..backends.broker.core import unsupported

            raise unsupported(getattr(self.backend, "kind", type(self.backend).__name__),
                              "cron")
        self.burst = burst  # stop once the queues are empty (Claimer.burst_turn)
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.prefetch_hold = float(prefetch_hold)
        self.lease_s = float(app.visibility_timeout if visibility_timeout is None
                             else visibility_timeout)
        if not self.lease_s > 0:
            raise ConfigurationError(
                f"visibility_timeout must be > 0 seconds, got {visibility_timeout!r}")
        if not poll_interval > 0:
            raise ConfigurationError(f"poll_interval must be > 0 seconds, got {poll_interval!r}")
        if not grace_period >= 0:
            raise ConfigurationError(f"grace_period must be >= 0 seconds, got {grace_period!r}")
        if not stuck_grace > 0:
            raise ConfigurationError(f"stuck_grace must be > 0 seconds, got {stuck_grace!r}")
        if not history_interval > 0:
            raise ConfigurationError(
                f"history_interval must be > 0 seconds, got {history_interval!r}")
        if not maintenance_interval > 0:
            raise ConfigurationError(
                f"maintenance_interval must be > 0 seconds, got {maintenance_interval!r}")
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
        self.heartbeat_file = HeartbeatFile(heartbeat_file, worker_id=self.id,
                                            max_age=self.lease_s)
        self.metrics = metrics if metrics is not None else app.metrics
        self.counters = WorkerCounters()
        # Outcomes counted for the store's history, flushed every history_interval (history.py).
        self.history = Recorder()
        self.history_interval = float(history_interval)
        self.started_at = time.time()
        self._rng = random.Random()
        self._context: contextvars.Context | None = None  # what tasks run in copies of
        self._stopping = False
        self._forced = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._started = asyncio.Event()  # replaced in run_async
        self._on_started: list[Callable[[], None]] = []
        # One room per concern; each reaches the others through this worker.
        self.capacity = Capacity(self)
        self.leases = Leases(self)
        self.completer = Completer(self)
        self.runner = Runner(self)
        self.claimer = Claimer(self)
        self.maintenance = Maintenance(self)

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

    def flush_history(self, timeout: float = 30.0) -> int:
        """Write the history this worker counted so far now, instead of at its next flush; the
        points written. From any thread but the worker's own event loop's (tests, a hook)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return 0
        future = asyncio.run_coroutine_threadsafe(self.maintenance.flush_history(), loop)
        return future.result(timeout)

    def stop(self, *, graceful: bool = True) -> None:
        """Ask the worker to stop; safe from any thread. A second, or non-graceful, call
        hurries it."""
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
                     self.id, self.grace_period, len(self.leases.jobs))
        self._stopping = True
        self.backend.wake()
        if self.capacity.slot_freed:
            self.capacity.slot_freed.set()
        if self._stopped and self._forced:
            self._stopped.set()

    # -- main --------------------------------------------------------------------------
    async def run_async(self) -> None:
        """Run on the caller's event loop until stopped (``run`` makes a loop of its own)."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self.capacity.slot_freed = asyncio.Event()
        self._stopped = asyncio.Event()
        self.completer.ready = asyncio.Event()
        # Separate threads so a slow claim never delays a heartbeat, and an idle wait blocks
        # neither.
        pool = concurrent.futures.ThreadPoolExecutor
        self._store = pool(2, thread_name_prefix="conveyor-store")
        self._beat = pool(1, thread_name_prefix="conveyor-heartbeat")
        self._maint = pool(1, thread_name_prefix="conveyor-maintenance")
        # One thread more than slots: an idle worker waits for jobs on it, and starts the first
        # job it claims right there (see Claimer._wait_then_claim).
        self._pool = TaskThreads(self.concurrency + 1, loop)
        self.claimer.near = self.backend.loop_claims()
        if self.install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._request_stop)
        await self._call(self._store, self.backend.record_worker, self._info())
        self.heartbeat_file.beat(store_ok=True)
        for text in await self._call(self._store, self.backend.startup_warnings):
            log.warning("%s", text)
        log.info("worker %s started: queues %s, concurrency %d, lease %gs",
                 self.id, ",".join(f"{q}:{w}" for q, w in self.weights.items()),
                 self.concurrency, self.lease_s)
        for line in self.app.task_listing():
            log.info("worker %s %s", self.id, line)
        # Before any job: process_init (once per process), then worker_started.
        await self.app.hooks.process_init(self._event("process_init"))
        await self.app.hooks.run_on_loop(self._event("worker_started"))
        helpers = [
            loop.create_task(self.completer.ack_loop(), name="conveyor-acks"),
            loop.create_task(self.leases.heartbeat_loop(), name="conveyor-heartbeat"),
            loop.create_task(self.maintenance.reap_and_promote_loop(),
                             name="conveyor-maintenance"),
            loop.create_task(self.maintenance.prune_loop(), name="conveyor-prune"),
            loop.create_task(self.maintenance.history_loop(), name="conveyor-history"),
        ]
        if self.scheduler and self.app.schedules:
            helpers.append(loop.create_task(self.maintenance.cron_loop(),
                                            name="conveyor-scheduler"))
        # Each slot's task may hold a pooled connection (transaction()): the pool makes room.
        for text in self.backend.reserve_connections(self.concurrency):
            log.warning("%s", text)
        self._started.set()
        for cb in self._on_started:
            cb()
        try:
            try:
                await self.claimer.run()
            finally:
                await self._drain()
        finally:
            # Its jobs are finished or released; the store is still open.
            await self.app.hooks.run_on_loop(self._event("worker_stopping"))
            await self._shut_down(loop, helpers)

    def _event(self, name: str) -> HookEvent:
        return HookEvent(name, self.app, worker_id=self.id)

    async def _shut_down(self, loop: asyncio.AbstractEventLoop,
                         helpers: list[asyncio.Task[None]]) -> None:
        if self.leases.reporting is not None:
            helpers.append(self.leases.reporting)
        for h in helpers:
            h.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        capacity = self.capacity
        if capacity.stuck_timer is not None:
            capacity.stuck_timer.cancel()
        if self.install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        # A cancelled heartbeat's record_worker may still be running on its thread: let it
        # land first, or it writes the row back after remove_worker (a ghost worker). Not
        # when hurried by a second signal: then exiting now matters more.
        if not self._forced:
            await asyncio.to_thread(self._beat.shutdown, wait=True, cancel_futures=True)
        self.heartbeat_file.remove()
        # Every outcome is counted by now (the drain is over): the last flush.
        await self.maintenance.flush_history()
        try:
            await self._call(self._store, self.backend.remove_worker, self.id)
        except Exception:
            log.exception("could not remove worker row")
        for ex in (self._store, self._beat, self._maint):
            ex.shutdown(wait=False, cancel_futures=True)
        self.backend.reserve_connections(-self.concurrency)
        self._pool.shutdown()
        if capacity.stuck and self.metrics is not None:
            # The worker is gone: threads still hung are no longer anyone's slots.
            self.metrics.stuck_slots.dec(len(capacity.stuck))
        capacity.stuck.clear()
        if self.claimer.near is not None:
            self.claimer.near.close()
        log.info("worker %s stopped: %d succeeded, %d retried, %d dead, %d released",
                 self.id, self.counters.succeeded, self.counters.retried, self.counters.dead,
                 self.counters.released)

    async def _call(self, executor: concurrent.futures.Executor, fn: Callable[..., T],
                    *args: Any, **kw: Any) -> T:
        assert self._loop is not None
        return await self._loop.run_in_executor(executor, lambda: fn(*args, **kw))

    def _info(self) -> WorkerInfo:
        return WorkerInfo(
            id=self.id, queues=list(self.weights), concurrency=self.concurrency,
            host=socket.gethostname(), pid=os.getpid(), started_at=self.started_at,
            last_seen=0.0,
            # held (prefetched) jobs are not running yet
            running=len(self.leases.jobs) - len(self.capacity.held),
            stuck=len(self.capacity.stuck),
        )

    async def _drain(self) -> None:
        """After stop: wait for running jobs up to the grace period, then release the rest."""
        assert self._stopped is not None
        capacity, jobs = self.capacity, self.leases.jobs
        if capacity.hold_timer is not None:
            capacity.hold_timer.cancel()
            capacity.hold_timer = None
        if capacity.giving_back:
            await asyncio.wait(list(capacity.giving_back))
        tasks = [r.task for r in jobs.values() if r.task is not None]
        if tasks and not self._forced:
            stopper: asyncio.Future[Any] = asyncio.ensure_future(self._stopped.wait())
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
        finishing = [r.task for r in jobs.values() if r.writing and r.task]
        if finishing:
            await asyncio.wait(finishing, timeout=min(5.0, self.lease_s))
        ack_deadline = time.monotonic() + min(5.0, self.lease_s)
        while any(r.acking for r in jobs.values()) and time.monotonic() < ack_deadline:
            await asyncio.sleep(0.005)  # the ack loop writes them (the claim loop has stopped)
        left_over = [r for r in jobs.values() if r.unfinished]
        if not left_over:
            return
        for r in left_over:
            r.lost = True  # tell the runner the cancel is ours
            r.stop()
        released = await self.completer.release([r.lease for r in left_over],
                                                "job(s) still running at shutdown")
        if released:
            log.warning("released %d job(s) still running at shutdown: %s",
                        len(released), released)
        await asyncio.gather(*[r.task for r in left_over if r.task is not None],
                             return_exceptions=True)
