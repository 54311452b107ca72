"""Keeping the store tidy: reaping expired leases, promoting due jobs, pruning old results, and
the cron schedules' turns (River's maintenance services)."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import TYPE_CHECKING

from ..history import DEAD, Recorder
from ..retention import PruneOutcome, Pruner, next_pass_in, retention_rules

if TYPE_CHECKING:
    from . import Worker

log = logging.getLogger("conveyor.worker")


class Maintenance:
    """The worker's maintenance loops; each runs on the worker's maintenance thread."""

    def __init__(self, w: Worker) -> None:
        self.w = w

    async def reap_and_promote_loop(self) -> None:
        w = self.w
        while True:
            await asyncio.sleep(w.maintenance_interval * w._rng.uniform(0.5, 1.5))
            try:
                # One worker of the fleet per interval (the store decides): every worker reaping
                # and promoting each second cost the store that work times the workers.
                if await w._call(w._maint, w.backend.maintenance_turn, w.maintenance_interval):
                    await self.reap_and_promote()
            except Exception:
                log.exception("maintenance failed")

    async def reap_and_promote(self) -> None:
        w = self.w
        reaped = await w._call(w._maint, w.backend.reap, limit=1000)
        if reaped.count:
            w.counters.reaped += reaped.count
            if w.metrics is not None:
                w.metrics.reaped.labels("requeued").inc(len(reaped.requeued))
                w.metrics.reaped.labels("dead").inc(len(reaped.dead))
            log.warning("reaped %d expired lease(s): %d back to available, %d dead",
                        reaped.count, len(reaped.requeued), len(reaped.dead))
            # A job the reaper made dead (its worker died or stalled on its last attempt) is in
            # the history's dead count like any other, so a crash shows there. A lease given
            # back to run again is not: it may not have been an attempt at all (a held job,
            # see Backend.reap); the live charts show lease expiries.
            for job_id in reaped.dead:
                queue = reaped.queues.get(job_id)
                if queue is not None:
                    w.history.note(queue, DEAD)
        await w._call(w._maint, w.backend.promote, limit=1000)

    async def prune_loop(self) -> None:
        """Retention (see retention.py), beside reaping and promoting so that a long pass
        never holds them up. Passes come every ``prune_interval`` at most, sooner when jobs
        finish faster than a batch per interval."""
        w = self.w
        # A store without history (a broker) has none to roll up: the pass leaves it alone.
        keep = None if "history" in w.backend.missing else w.app.history_days
        pruner = Pruner(w.backend, retention_rules(w.app), history_days=keep)
        call = functools.partial(w._call, w._maint)
        # At a random point of the first interval: workers started together spread out.
        await asyncio.sleep(w.prune_interval * w._rng.uniform(0, 1))
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
                                 shortest=w.maintenance_interval, longest=w.prune_interval)
            last = started
            await asyncio.sleep(delay)

    async def history_loop(self) -> None:
        """Flush the history counted here every ``history_interval`` (spread by a random share,
        so workers started together do not write at the same instant)."""
        w = self.w
        while True:
            await asyncio.sleep(w.history_interval * w._rng.uniform(0.8, 1.2))
            await self.flush_history()

    async def flush_history(self) -> int:
        """Add what this worker counted to the store's history in one write; the points written.
        Taken on the event loop, where the counting happens. Points the store refused are put
        back for the next flush."""
        w = self.w
        recorder: Recorder = w.history
        points = recorder.take()
        if not points or "history" in w.backend.missing:
            return 0  # a store without history (a broker): the counts are dropped, not kept
        try:
            await w._call(w._maint, w.backend.record_history, points)
        except asyncio.CancelledError:
            raise  # the write may land still: putting the points back could count them twice
        except Exception:
            log.warning("could not write the history; it goes with the next flush", exc_info=True)
            recorder.put_back(points)
            return 0
        return len(points)

    async def cron_loop(self) -> None:
        from ..cron import Scheduler

        w = self.w
        scheduler = Scheduler(w.app, w.backend)
        log.info("scheduler on: %d cron schedule(s)", len(w.app.schedules))
        while True:
            try:
                await w._call(w._maint, scheduler.run_pending)
            except Exception:
                log.exception("cron scheduler failed; trying again")
            # A check every ~0.5 s keeps minute ticks on time and per-second (6-field) ones
            # close.
            await asyncio.sleep(w._rng.uniform(0.25, 0.75))
