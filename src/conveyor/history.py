"""A worker's share of the store's history (backends/history.py): the outcomes of its own
attempts, counted in memory per (queue, minute) and added to the store's rows by a flush every
``FLUSH_S`` or so and at shutdown, one additive write per flush (never one per job).

Counting an attempt is a dict lookup and a few additions on the event loop's thread; the flush
takes the whole dict on that thread too (``take``), so nothing here needs a lock. A worker
killed without its shutdown flush loses what it counted since its last flush: at most about
``FLUSH_S`` of its outcomes. A flush the store refused is put back and sent with the next one;
one whose answer was lost after it was written is counted again (the write is additive).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from .backends.history import MINUTE, HistoryPoint

FLUSH_S = 12.0  # seconds between a worker's flushes (each one spread by a random share)
PROCESSED, FAILED, DEAD = 0, 1, 2  # where each outcome is counted in a pending row


class Recorder:
    """One worker's counts not yet in the store, per (queue, minute of the worker's clock)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        # (queue, minute) -> [processed, failed, dead, wait_sum, run_sum]
        self.pending: dict[tuple[str, int], list[float]] = {}

    def note(self, queue: str, outcome: int, wait: float = 0.0, run: float = 0.0) -> None:
        """Count one attempt's ``outcome`` (PROCESSED, FAILED or DEAD): the per-job cost. The
        pickup latency ``wait`` and run time ``run`` are summed for succeeded attempts only: a
        failed attempt's run time says little, and one the reaper took back (its worker died)
        has none to tell."""
        t = int(self._clock())
        key = (queue, t - t % MINUTE)
        row = self.pending.get(key)
        if row is None:
            row = self.pending[key] = [0, 0, 0, 0.0, 0.0]
        row[outcome] += 1
        if outcome == PROCESSED:  # latency is that of succeeded attempts (see historyview)
            row[3] += wait
            row[4] += run

    def take(self) -> list[HistoryPoint]:
        """Everything counted so far, as minute points; the counts start again from zero."""
        pending, self.pending = self.pending, {}
        return [HistoryPoint(queue=q, at=at, processed=int(r[0]), failed=int(r[1]),
                             dead=int(r[2]), wait_sum=r[3], run_sum=r[4])
                for (q, at), r in sorted(pending.items(), key=lambda kv: (kv[0][1], kv[0][0]))]

    def put_back(self, points: Sequence[HistoryPoint]) -> None:
        """Points a flush could not write: counted again, to go with the next flush."""
        for p in points:
            row = self.pending.setdefault((p.queue, p.at), [0, 0, 0, 0.0, 0.0])
            row[0] += p.processed
            row[1] += p.failed
            row[2] += p.dead
            row[3] += p.wait_sum
            row[4] += p.run_sum
