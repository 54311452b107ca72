"""History kept in the store: per queue, per minute, how many attempts succeeded, failed (to be
retried) and went dead, and the sums of their pickup latency and run time.

Workers write it (``conveyor.history.Recorder``): each counts its own outcomes in memory and
adds them to the store's rows every ``FLUSH_S`` or so, one additive write per flush. The
retention pass rolls minute rows older than ``MINUTES_KEPT`` into hourly rows, and deletes
hourly rows after the app's ``history_days``. These are the values that cross the seam.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MINUTE = 60
HOUR = 3600
MINUTES_KEPT = 86400.0  # minute rows older than this are rolled up into hourly rows
FIELDS = ("processed", "failed", "dead", "wait_sum", "run_sum")


@dataclass(frozen=True)
class HistoryPoint:
    """One queue's counts over one bucket: ``span`` seconds (MINUTE or HOUR) from ``at``
    (unix seconds, a multiple of ``span``)."""

    queue: str
    at: int
    span: int = MINUTE
    processed: int = 0
    """Attempts that succeeded."""
    failed: int = 0
    """Attempts that failed and will be retried."""
    dead: int = 0
    """Attempts that failed for good (the job went dead)."""
    wait_sum: float = 0.0
    """Pickup latency of every attempt counted here, summed: its start minus its ``run_at``."""
    run_sum: float = 0.0
    """Run time of every attempt counted here, summed."""

    @property
    def attempts(self) -> int:
        return self.processed + self.failed + self.dead

    @property
    def avg_wait(self) -> float | None:
        return self.wait_sum / self.attempts if self.attempts else None

    @property
    def avg_run(self) -> float | None:
        return self.run_sum / self.attempts if self.attempts else None


def check_points(points: Sequence[HistoryPoint]) -> None:
    """``record_history`` takes minute points only, each at the start of its minute."""
    for p in points:
        if p.span != MINUTE or p.at % MINUTE:
            raise ValueError(f"record_history takes minute points at whole minutes, not {p!r}")


def rollup_cutoff(now: float) -> int:
    """Minute rows before this (an hour boundary, at least MINUTES_KEPT ago) are rolled up:
    an hour is rolled whole, so a reader never sees half of it in each resolution for long."""
    return int((now - MINUTES_KEPT) // HOUR * HOUR)
