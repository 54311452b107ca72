"""Leases: the jobs this worker holds a lease on, their heartbeat, the report that held jobs
started, and what happens when a lease is found lost (BullMQ's lock manager)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ..job import Job, JobState
from .capacity import Running
from .completer import count, log_job

if TYPE_CHECKING:
    from . import Worker

log = logging.getLogger("conveyor.worker")
# Held (prefetched) jobs a worker starts are reported started to the store (a heartbeat of their
# leases) at most this often: the store charges an attempt only for a job it knows started, so
# this bounds the time a job runs uncounted, for at most 1/MARK_SPACING_S writes a second.
MARK_SPACING_S = 0.1


class Leases:
    """Keeps the leases of this worker's jobs alive, and stops the jobs whose lease is lost."""

    def __init__(self, w: Worker) -> None:
        self.w = w
        # Every job this worker holds a lease on and has not settled: held, running, or
        # waiting for its outcome to land. Heartbeated.
        self.jobs: dict[int, Running] = {}
        self.unreported: list[Running] = []  # held jobs started here, not yet reported started
        self.reporting: asyncio.Task[None] | None = None  # the task that reports them

    def forget(self, running: Running) -> None:
        """Drop a finished job from the jobs heartbeated, unless its id now names another job:
        ids repeat after a store's data loss, and the newer job must stay heartbeated."""
        if self.jobs.get(running.job.id) is running:
            del self.jobs[running.job.id]

    async def heartbeat_loop(self) -> None:
        w = self.w
        while True:
            await asyncio.sleep(w.heartbeat_interval)
            beating = [r for r in list(self.jobs.values())
                       if not r.settled and not r.lost and not r.completing]
            # Jobs still waiting for a slot; every other one has started, and this write says so.
            waiting = {r.job.id for r in w.capacity.held}
            try:
                lost = await w._call(w._beat, w.backend.heartbeat, [r.lease for r in beating],
                                     lease_s=w.lease_s, held=waiting)
                await w._call(w._beat, w.backend.record_worker, w._info())
            except Exception:
                log.exception("heartbeat failed; leases run out in %gs unless it recovers",
                              w.lease_s)
                w.heartbeat_file.beat(store_ok=False)
                continue
            w.heartbeat_file.beat(store_ok=True)
            for r in beating:
                # Refused because the job is done, not because the lease was lost: its task
                # completed it in its own transaction, or its ack, retry or kill landed
                # meanwhile (while an outcome is on its way, its answer says whether the lease
                # held).
                if r.job.id in lost and not r.settled and not r.writing and not r.completing:
                    await self._lost(r)

    async def _lost(self, r: Running) -> None:
        """A heartbeat found the job's lease lost: stop it, and say why."""
        w = self.w
        r.lost = True
        r.stop()
        held = w.capacity.held
        if r.task is None and r in held:  # held, never started: nothing to stop
            held.remove(r)
            w.completer.settle(r)
        outcome = await self.why_lost(r.job)
        if outcome == "lease_lost":
            w.counters.lease_lost += 1
            if w.metrics is not None:
                w.metrics.leases_lost.labels(r.job.queue).inc()
        count(w, r.job, outcome)
        log_job(w, logging.WARNING, r.job, outcome, "job %d %s: %s; stopped it", r.job.id,
                r.job.task, "cancelled" if outcome == "cancelled"
                else "lease lost (expired or taken over)")

    async def why_lost(self, job: Job) -> str:
        """``cancelled`` if someone cancelled the job, else ``lease_lost``."""
        w = self.w
        try:
            current = await w._call(w._maint, w.backend.get, job.id)
        except Exception:
            return "lease_lost"
        if current is not None and current.state is JobState.CANCELLED:
            return "cancelled"
        return "lease_lost"

    def report_started_soon(self) -> None:
        """Start the report of held jobs that started, unless it runs already."""
        loop = self.w._loop
        if self.unreported and self.reporting is None and loop is not None:
            self.reporting = loop.create_task(self._report_started(),
                                              name="conveyor-mark-started")

    async def _report_started(self) -> None:
        """Tell the store that held jobs started here (a heartbeat of their leases marks them):
        until it knows, a lease that runs out on one gives it back uncounted, as a job that
        never started. Started jobs are reported together, at most every MARK_SPACING_S; a job
        that finished meanwhile needs nothing (its outcome counts the attempt)."""
        w = self.w
        try:
            while self.unreported:
                batch, self.unreported = self.unreported, []
                leases = [r.lease for r in batch if r.unfinished and not r.lost]
                if leases:
                    try:
                        await w._call(w._beat, w.backend.heartbeat, leases, lease_s=w.lease_s)
                    except Exception as exc:  # the next heartbeat reports them
                        log.warning("could not report %d started job(s): %s", len(leases), exc)
                await asyncio.sleep(MARK_SPACING_S)
        finally:
            self.reporting = None
