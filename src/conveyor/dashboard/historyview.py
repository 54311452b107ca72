"""The charts of the store's history (backends/history.py): the same numbers for every
dashboard, before and after a restart, over a range the URL picks (``?range=6h``).

Each range reads the store's rows once and sums them into buckets of a fixed width: minute
rows where the store still keeps them (the last day), hourly rows beyond. The live charts of
this process's own samples (sampler.py) stay beside these, labelled as live.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..backends.base import Backend, HistoryPoint
from ..backends.history import MINUTE
from .charts import Chart, Point, Series, layout


@dataclass(frozen=True)
class Range:
    key: str  # as in the URL
    label: str
    seconds: int
    bucket: int  # width of one chart point, seconds


RANGES = (Range("1h", "1 h", 3600, 60), Range("6h", "6 h", 6 * 3600, 300),
          Range("24h", "24 h", 86400, 900), Range("7d", "7 d", 7 * 86400, 3600))
BY_KEY = {r.key: r for r in RANGES}
DEFAULT = RANGES[0]


def parse_range(value: str | None) -> Range:
    """The range a URL asks for; the default (1 h) for anything else."""
    return BY_KEY.get(value or "", DEFAULT)


@dataclass
class Bucket:
    processed: int = 0
    failed: int = 0
    dead: int = 0
    wait_sum: float = 0.0
    run_sum: float = 0.0

    def add(self, p: HistoryPoint) -> None:
        self.processed += p.processed
        self.failed += p.failed
        self.dead += p.dead
        self.wait_sum += p.wait_sum
        self.run_sum += p.run_sum

    @property
    def attempts(self) -> int:
        return self.processed + self.failed + self.dead


@dataclass
class HistoryView:
    range: Range
    ranges: tuple[Range, ...]
    charts: list[Chart]
    total: Bucket
    kept: bool = True  # False: the store keeps no history (a broker alone)

    @property
    def avg_wait(self) -> float | None:
        return self.total.wait_sum / self.total.processed if self.total.processed else None

    @property
    def avg_run(self) -> float | None:
        return self.total.run_sum / self.total.processed if self.total.processed else None


def history_view(backend: Backend, rng: Range, *, now: float,
                 queue: str | None = None) -> HistoryView:
    """Read the range ending at ``now`` (the store's clock) and build its charts."""
    end = int(now) - int(now) % MINUTE + MINUTE  # the current minute counts too
    start = end - rng.seconds
    first = start - start % rng.bucket
    kept = "history" not in backend.missing
    points = backend.history(queue=queue, since=first, until=end) if kept else []
    buckets = {t: Bucket() for t in range(first, end, rng.bucket)}
    total = Bucket()
    for p in points:
        buckets.setdefault(p.at - p.at % rng.bucket, Bucket()).add(p)
        total.add(p)
    return HistoryView(rng, RANGES, _charts(buckets, rng), total, kept)


def _charts(buckets: Mapping[int, Bucket], rng: Range) -> list[Chart]:
    per_minute = MINUTE / rng.bucket
    times = sorted(buckets)

    def series(pick: str) -> list[Point]:
        return [(float(t), getattr(buckets[t], pick) * per_minute) for t in times]

    def average(total: str) -> list[Point]:
        out: list[Point] = []
        for t in times:
            b = buckets[t]
            # Sums of succeeded attempts' latency (history.Recorder.note): per succeeded one.
            out.append((float(t), getattr(b, total) / b.processed if b.processed else None))
        return out

    every = "a minute" if rng.bucket == MINUTE else f"{rng.bucket // 60} min"
    kept = f"store history, last {rng.label}, per {every}"
    charts = [
        Chart("Throughput", f"succeeded per minute · {kept}",
              [Series("succeeded/min", "ok", series("processed"), area=True)]),
        Chart("Failures", f"attempts per minute · {kept}",
              [Series("failed, retried", "warn", series("failed")),
               Series("went dead", "bad", series("dead"), area=True)]),
        Chart("Latency", f"seconds, average per attempt · {kept}",
              [Series("pickup (start - due)", "s1", average("wait_sum")),
               Series("run time", "s2", average("run_sum"))]),
    ]
    quiet = not any(b.attempts for b in buckets.values())
    for c in charts:
        if quiet:  # no attempt at all: say so rather than draw a line at zero
            for s in c.series:
                s.points = [(t, None) for t, _ in s.points]
        layout(c)
        c.empty_note = (f"No history in the last {rng.label}: workers write theirs about "
                        "every 12 s.")
    return charts
