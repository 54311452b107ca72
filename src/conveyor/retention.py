"""Retention: deleting finished jobs once their time to be kept has passed.

A worker runs prune passes beside its maintenance loop. A pass deletes bounded batches
(``Backend.prune(limit=batch)``) until a batch comes back short, pausing between batches for
a quarter of the time the last one took (``PAUSE_SHARE``), so producers and workers get
their turn at the store (on SQLite, the file's one writer). A pass holds the
store-wide lock ``PRUNE_LOCK`` (``Backend.try_lock``): one pruner at a time across the fleet,
the others skip their turn. A pass stops after ``max_batches`` (it lets go of the lock, and
says there is more). The worker runs passes beside its reaping and promoting, so a long one
holds neither up, and times the next pass by what this one found (:func:`next_pass_in`): about
when another batch will have come due at the rate jobs finished since the last pass, between
its maintenance interval and ``prune_interval``. Under sustained load the finished rows then
stay near what ``result_ttl`` keeps plus about a batch.

The same pass, under the same lock, keeps the history (backends/history.py) in bounds: minute
rows older than a day are rolled up into hourly rows, and hourly rows older than the app's
``history_days`` are deleted (``Backend.rollup_history``, ``batch`` rows a call).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from .job import JobState

if TYPE_CHECKING:
    from .app import Conveyor
    from .backends.base import Backend, StoreLock

log = logging.getLogger("conveyor.retention")

T = TypeVar("T")
# Runs a blocking store call off the event loop (the worker's maintenance thread).
Call = Callable[[Callable[[], Any]], Awaitable[Any]]

PRUNE_LOCK = "prune"
# The pause after a batch, as a share of the batch's time: other writes wait at most one
# batch and get a fifth of the time, and deleting still keeps pace with a busy store.
PAUSE_SHARE = 0.25


@dataclass(frozen=True)
class Rule:
    """Jobs in ``states`` are deleted ``older_than`` seconds after they finished."""

    states: tuple[JobState, ...]
    older_than: float


def retention_rules(app: Conveyor) -> list[Rule]:
    """The app's settings: succeeded and cancelled jobs after ``result_ttl`` (0: kept), dead
    ones after ``dead_ttl`` (None: kept until purged)."""
    rules = []
    if app.result_ttl > 0:
        rules.append(Rule((JobState.SUCCEEDED, JobState.CANCELLED), app.result_ttl))
    if app.dead_ttl is not None:
        rules.append(Rule((JobState.DEAD,), app.dead_ttl))
    return rules


@dataclass(frozen=True)
class PruneOutcome:
    deleted: int = 0  # jobs, and history rows rolled up or deleted
    more: bool = False  # stopped after max_batches, the last one full: run again at once
    skipped: bool = False  # another pruner holds the lock


def next_pass_in(outcome: PruneOutcome, since_last: float, *, batch: int, shortest: float,
                 longest: float) -> float:
    """Seconds until the next pass: at once if this one stopped with more; else about when a
    batch will have come due again at the rate this pass found (``since_last`` is the time
    since the previous pass started), within [shortest, longest]."""
    if outcome.more:
        return 0.0
    if outcome.skipped or outcome.deleted <= 0:
        return longest
    return min(longest, max(shortest, since_last * batch / outcome.deleted))


def _release_taken(taking: asyncio.Future[Any]) -> None:
    if taking.cancelled() or taking.exception() is not None or taking.result() is None:
        return
    try:
        taking.result().release()
    except Exception:
        log.warning("could not release the prune lock", exc_info=True)


async def _in_thread(fn: Callable[[], T]) -> T:
    return await asyncio.to_thread(fn)


class Pruner:
    def __init__(
        self, backend: Backend, rules: Sequence[Rule], *, batch: int = 1000, max_batches: int = 100,
        pause: float = 0.01, max_pause: float = 0.25, lock_ttl: float = 60.0,
        history_days: float | None = None,
    ) -> None:
        self.backend = backend
        self.rules = list(rules)
        self.history_days = history_days  # None: this pass leaves the history alone
        self.batch = batch
        self.max_batches = max_batches
        # Between batches: a quarter of the last batch's time, within [pause, max_pause].
        self.pause = pause
        self.max_pause = max_pause
        self.lock_ttl = lock_ttl  # a holder that died without releasing holds it this long at most

    async def run(self, *, now: float | None = None, call: Call = _in_thread) -> PruneOutcome:
        """One pass: ``now`` is for tests (None: the store's clock); ``call`` runs each store
        call off the event loop."""
        if not self.rules and self.history_days is None:
            return PruneOutcome()
        try_lock = functools.partial(self.backend.try_lock, PRUNE_LOCK, ttl=self.lock_ttl)
        taking = asyncio.ensure_future(call(try_lock))
        try:
            lock: StoreLock | None = await asyncio.shield(taking)
        except asyncio.CancelledError:
            # Stopped while the store was answering: a lock taken after all must not outlive us.
            taking.add_done_callback(_release_taken)
            raise
        if lock is None:
            return PruneOutcome(skipped=True)
        try:
            return await self._batches(lock, now, call)
        finally:
            try:
                await call(lock.release)
            except Exception:
                # It frees itself (connection, process or ttl); the next pass may skip till then.
                log.warning("could not release the prune lock", exc_info=True)

    async def _batches(self, lock: StoreLock, now: float | None, call: Call) -> PruneOutcome:
        deleted = 0
        for rule in self.rules:
            while True:
                started = time.monotonic()
                n: int = await call(functools.partial(
                    self.backend.prune, older_than=rule.older_than, states=rule.states,
                    limit=self.batch, now=now))
                deleted += n
                if n < self.batch:
                    break
                took = time.monotonic() - started
                await asyncio.sleep(min(max(self.pause, took * PAUSE_SHARE), self.max_pause))
                if deleted >= self.batch * self.max_batches:
                    return PruneOutcome(deleted, more=True)  # the history waits for the next
                if not await call(lock.renew):
                    # Another pruner may have it now: leave the rest to it.
                    return PruneOutcome(deleted)
        if self.history_days is None:
            return PruneOutcome(deleted)
        rolled: int = await call(functools.partial(
            self.backend.rollup_history, keep_days=self.history_days, limit=self.batch, now=now))
        # One bounded call a pass: a full one asks for the next pass at once.
        return PruneOutcome(deleted + rolled, more=rolled >= self.batch)
