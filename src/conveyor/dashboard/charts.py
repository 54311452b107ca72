"""Line charts as plain SVG geometry, computed here and drawn by a template macro.

No chart library and no script: the numbers become polyline points, grid lines and labels,
and Jinja escapes the only text that comes from data (queue names in legends).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from ..backends.base import QueueStats
from .sampler import Sample

WIDTH, HEIGHT = 440.0, 180.0
LEFT, RIGHT, TOP, BOTTOM = 40.0, 10.0, 10.0, 24.0
Y_INTERVALS = 4
PALETTE = ("s1", "s2", "s3", "s4", "s5", "s6")  # CSS classes; colours live in dashboard.css
TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
              43200, 86400)

Point = tuple[float, float | None]


@dataclass
class Series:
    label: str
    css: str
    points: list[Point]
    area: bool = False
    segments: list[str] = field(default_factory=list)  # "x,y x,y ..." per unbroken run
    area_paths: list[str] = field(default_factory=list)
    last: float | None = None


@dataclass
class Tick:
    pos: float
    label: str


@dataclass
class Chart:
    title: str
    unit: str
    series: list[Series]
    empty_note: str = ""
    width: float = WIDTH
    height: float = HEIGHT
    y_ticks: list[Tick] = field(default_factory=list)
    x_ticks: list[Tick] = field(default_factory=list)
    plot_left: float = LEFT
    plot_right: float = WIDTH - RIGHT
    plot_top: float = TOP
    plot_bottom: float = HEIGHT - BOTTOM
    summary: str = ""

    @property
    def empty(self) -> bool:
        return not any(v is not None for s in self.series for _, v in s.points)


def nice_step(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k that is >= value (and > 0): a grid step people read."""
    if value <= 0:
        return 0.25
    exp = math.floor(math.log10(value))
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        if m * 10**exp >= value * 0.999999:
            return float(m * 10**exp)
    return float(10.0 ** (exp + 1))  # pragma: no cover - the loop always returns


def fmt_number(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v / 1000:.2f}".rstrip("0").rstrip(".") + "k"
    return f"{v:.3f}".rstrip("0").rstrip(".")


def layout(chart: Chart) -> Chart:
    """Fill in the geometry: scales, ticks and the polyline points of every series."""
    values = [v for s in chart.series for _, v in s.points if v is not None]
    times = [t for s in chart.series for t, _ in s.points]
    if not values or len(times) < 2:
        return chart
    t0, t1 = min(times), max(times)
    if t1 - t0 < 1e-6:
        t0 -= 1
    step_y = nice_step(max(values) / Y_INTERVALS)
    top = step_y * Y_INTERVALS
    x0, x1, y0, y1 = chart.plot_left, chart.plot_right, chart.plot_bottom, chart.plot_top

    def x(t: float) -> float:
        return round(x0 + (t - t0) / (t1 - t0) * (x1 - x0), 1)

    def y(v: float) -> float:
        return round(y0 - v / top * (y0 - y1), 1)

    chart.y_ticks = [Tick(y(step_y * i), fmt_number(step_y * i)) for i in range(Y_INTERVALS + 1)]
    span = t1 - t0
    step = next((s for s in TIME_STEPS if span / s <= 6), TIME_STEPS[-1])
    first = math.ceil(t0 / step) * step
    fmt = "%H:%M:%S" if step < 60 else "%H:%M" if step < 86400 else "%m-%d"
    chart.x_ticks = [
        Tick(x(t), dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime(fmt))
        for t in _frange(first, t1, step)
    ]
    for s in chart.series:
        runs: list[list[tuple[float, float]]] = [[]]
        for t, v in s.points:
            if v is None:
                if runs[-1]:
                    runs.append([])
                continue
            runs[-1].append((x(t), y(v)))
        runs = [r for r in runs if r]
        s.segments = [" ".join(f"{px},{py}" for px, py in run) for run in runs]
        if s.area:
            s.area_paths = [
                f"M{run[0][0]},{y0} " + " ".join(f"L{px},{py}" for px, py in run)
                + f" L{run[-1][0]},{y0} Z"
                for run in runs if len(run) > 1
            ]
        s.last = next((v for _, v in reversed(s.points) if v is not None), None)
    return chart


def _frange(start: float, stop: float, step: float) -> list[float]:
    out: list[float] = []
    t = start
    while t <= stop + 1e-9 and len(out) < 20:
        out.append(t)
        t += step
    return out


# -- series from samples ---------------------------------------------------------------
Pick = Callable[[QueueStats], float]


def _total(sample: Sample, pick: Pick, queue: str | None) -> float | None:
    if queue is not None:
        q = sample.queues.get(queue)
        return pick(q) if q is not None else 0.0
    return sum(pick(q) for q in sample.queues.values())


def rate(samples: Sequence[Sample], pick: Pick, queue: str | None = None,
         per: float = 1.0) -> list[Point]:
    """Per-``per``-seconds increase of a counter between consecutive samples. A decrease (pruning
    deleted finished jobs) is a gap, not a negative rate."""
    points: list[Point] = []
    for prev, cur in pairwise(samples):
        dt_s = cur.at - prev.at
        a, b = _total(prev, pick, queue), _total(cur, pick, queue)
        if dt_s <= 0 or a is None or b is None:
            continue
        delta = b - a
        points.append((cur.at, delta / dt_s * per if delta >= 0 else None))
    return points


def level(samples: Sequence[Sample], pick: Pick, queue: str | None = None) -> list[Point]:
    return [(s.at, _total(s, pick, queue)) for s in samples]


def _finished(q: QueueStats) -> float:
    return float(q.succeeded)


def throughput_chart(samples: Sequence[Sample], queue: str | None = None) -> Chart:
    done = rate(samples, _finished, queue)
    chart = Chart("Throughput", "jobs succeeded per second",
                  [Series("succeeded/s", "ok", done, area=True)])
    return _finish(chart, samples)


def failures_chart(samples: Sequence[Sample], queue: str | None = None) -> Chart:
    dead = rate(samples, lambda q: float(q.dead), queue, per=60.0)
    expired = rate(samples, lambda q: float(q.lease_expiries), queue, per=60.0)
    chart = Chart("Failures", "per minute",
                  [Series("went dead", "bad", dead, area=True),
                   Series("lease expired", "warn", expired)])
    return _finish(chart, samples)


def backlog_chart(samples: Sequence[Sample], queue: str | None = None,
                  max_series: int = 5) -> Chart:
    if queue is not None:
        waiting = level(samples, lambda q: float(q.depth), queue)
        running = level(samples, lambda q: float(q.running), queue)
        series = [Series("waiting", "s1", waiting, area=True), Series("running", "s2", running)]
        return _finish(Chart("Backlog", "jobs", series), samples)
    names: dict[str, float] = {}
    for s in samples:
        for name, q in s.queues.items():
            names[name] = max(names.get(name, 0.0), float(q.depth))
    top = sorted(names, key=lambda n: (-names[n], n))[:max_series]
    series = [Series(name, PALETTE[i % len(PALETTE)],
                     level(samples, lambda q: float(q.depth), name))
              for i, name in enumerate(sorted(top))]
    if len(names) > max_series:
        series.append(Series("all queues", "total", level(samples, lambda q: float(q.depth))))
    return _finish(Chart("Backlog", "jobs waiting, by queue", series), samples)


def sparkline(samples: Sequence[Sample], queue: str) -> str:
    """The throughput of one queue as the points of a 100x20 polyline ('' until 2 samples)."""
    points = [(t, v) for t, v in rate(samples, _finished, queue) if v is not None]
    if len(points) < 2:
        return ""
    t0, t1 = points[0][0], points[-1][0]
    top = max(v for _, v in points) or 1.0
    span = (t1 - t0) or 1.0
    return " ".join(f"{(t - t0) / span * 100:.1f},{20 - v / top * 18 - 1:.1f}" for t, v in points)


def _finish(chart: Chart, samples: Sequence[Sample]) -> Chart:
    if len(samples) < 2:
        chart.empty_note = "Collecting samples: the chart starts after the second one."
        return chart
    layout(chart)
    if chart.empty:
        chart.empty_note = "No data in this window."
    span = samples[-1].at - samples[0].at
    chart.summary = f"last {_span(span)}"
    return chart


def _span(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
