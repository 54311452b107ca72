"""Rows, medians, the paced producer and the helpers every store driver shares."""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlite_bench import Proc, percentile, running

# (scenario, attribute, label, format); the order of the tables and charts
SCENARIOS = ("enqueue", "enqueue_many", "drain", "drain_2p", "latency", "latency_load")
METRICS = (
    ("enqueue", "jobs_per_s", "enqueue one by one, jobs/s", ",.0f"),
    ("enqueue_many", "jobs_per_s", "bulk enqueue (1000 per call), jobs/s", ",.0f"),
    ("drain", "jobs_per_s", "drain the backlog, 1 worker process, jobs/s", ",.0f"),
    ("drain_2p", "jobs_per_s", "drain the backlog, 2 worker processes, jobs/s", ",.0f"),
    ("latency", "p50_ms", "idle latency p50, ms", ".1f"),
    ("latency", "p99_ms", "idle latency p99, ms", ".1f"),
    ("latency_load", "p50_ms", "latency at half its drain rate, p50, ms", ".1f"),
    ("latency_load", "p99_ms", "latency at half its drain rate, p99, ms", ".1f"),
)


@dataclass
class Row:
    system: str
    scenario: str
    jobs: int = 0
    jobs_per_s: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    note: str = ""
    na: bool = False
    samples_ms: list[float] = field(default_factory=list, repr=False)
    extra: dict[str, Any] = field(default_factory=dict)
    # The scenario raised (note says what); no figure. Last: rows are made positionally.
    failed: bool = False

    def public(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "samples_ms"}


def from_result(r: Any) -> Row:
    """A row from a ``sqlite_bench.Result`` or ``redis_bench.Result``."""
    na = r.seconds is None and r.p50_ms is None
    extra = dict(getattr(r, "extra", {}) or {})
    if getattr(r, "cpu_ms_per_job", None) is not None:
        # redis_bench's worker CPU from time.process_time() in the worker over its body clock;
        # kept beside the harness's own figure (harness.cpu: /proc, over the rate's window)
        extra["worker_cpu_ms_per_job_in_process"] = r.cpu_ms_per_job
    return Row(
        r.system,
        r.scenario,
        r.jobs,
        r.jobs_per_s,
        r.p50_ms,
        r.p99_ms,
        r.note,
        na,
        list(r.samples_ms),
        extra,
    )


def na(system: str, scenario: str, why: str) -> Row:
    return Row(system, scenario, note=f"n/a: {why}", na=True)


def guarded(system: str, scenario: str, run: Callable[..., Row], *args: Any) -> Row:
    """Run one scenario of one system. If it raises, a row saying so (the traceback printed),
    not the end of the store's run: a peer's client dropped by the broker in one round must
    not cost every other system's figures, nor this system's other rounds."""
    try:
        return run(*args)
    except Exception as e:
        import traceback

        traceback.print_exc()
        text = f"{type(e).__name__}: {e}".replace("\n", " ").replace("|", "/").replace("|", "/")
        return Row(system, scenario, note=f"failed: {text[:300]}", failed=True)


def latency_row(
    system: str, scenario: str, samples_ms: list[float], note: str = "", **extra: Any
) -> Row:
    return Row(
        system,
        scenario,
        len(samples_ms),
        None,
        percentile(samples_ms, 50),
        percentile(samples_ms, 99),
        note,
        samples_ms=samples_ms,
        extra=extra,
    )


def say(row: Row) -> None:
    if row.na:
        value = "n/a"
    elif row.jobs_per_s is not None:
        value = f"{row.jobs_per_s:,.0f} jobs/s"
    else:
        value = f"p50 {row.p50_ms:.2f} ms, p99 {row.p99_ms:.2f} ms ({row.jobs} samples)"
    print(f"  {row.system:<18} {row.scenario:<13} {value:<40} {row.note}", flush=True)


def summarize(rounds: list[list[Row]]) -> list[Row]:
    """One row per (system, scenario): the median jobs/s over rounds; latency samples pooled."""
    groups: dict[tuple[str, str], list[Row]] = {}
    failures: dict[tuple[str, str], Row] = {}
    for rs in rounds:
        for r in rs:
            if r.failed:  # no figure: the median is of the rounds that gave one
                failures.setdefault((r.system, r.scenario), r)
            else:
                groups.setdefault((r.system, r.scenario), []).append(r)
    out = [Row(r.system, r.scenario, note=r.note, na=True, failed=True)
           for key, r in failures.items() if key not in groups]
    for (system, scenario), g in groups.items():
        first = g[0]
        if first.na:
            out.append(first)
        elif first.jobs_per_s is None:
            pooled = [x for r in g for x in r.samples_ms]
            out.append(latency_row(system, scenario, pooled, first.note, **first.extra))
        else:
            rates = [r.jobs_per_s for r in g if r.jobs_per_s is not None]
            med = statistics.median(rates)
            nearest = min(g, key=lambda r: abs((r.jobs_per_s or 0) - med))
            note = nearest.note + (
                f" (median of {len(rates)}: " + ", ".join(f"{x:,.0f}" for x in rates) + ")"
                if len(rates) > 1
                else ""
            )
            out.append(
                Row(system, scenario, first.jobs, med, None, None, note, extra=nearest.extra)
            )
    return out


def rotate(names: list[str], k: int) -> list[str]:
    k %= len(names)
    return names[k:] + names[:k]


# The steady-load producer's nice value (run.py --producer-nice): on a 2-core machine the
# producer, the worker and the store share the cores, and a producer at nice 19 shows how much
# of a system's latency under load is the producer's claim on them.
PRODUCER_NICE = 0


@contextlib.contextmanager
def producer_niceness() -> Iterator[None]:
    """The calling thread at PRODUCER_NICE for the block (Linux: a thread's own nice value;
    the worker processes, started before, keep theirs), then back."""
    if not PRODUCER_NICE:
        yield
        return
    before = os.getpriority(os.PRIO_PROCESS, 0)
    os.setpriority(os.PRIO_PROCESS, 0, PRODUCER_NICE)
    try:
        yield
    finally:
        with contextlib.suppress(PermissionError):  # going back up needs CAP_SYS_NICE
            os.setpriority(os.PRIO_PROCESS, 0, before)


def paced(rate: float, seconds: float, send: Callable[[int], None]) -> tuple[int, float]:
    """Call ``send(i)`` ``rate`` times a second for ``seconds`` (on a fixed schedule, catching up
    without bursts beyond the schedule if it falls behind); returns (calls, achieved rate). At
    PRODUCER_NICE, if set."""
    total = max(1, int(rate * seconds))
    with producer_niceness():
        t0 = time.perf_counter()
        for i in range(total):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            send(i)
        elapsed = time.perf_counter() - t0
    return total, total / elapsed if elapsed > 0 else float("inf")


def load_note(offered: float, achieved: float) -> str:
    note = f"offered {offered:,.0f} jobs/s (half its drain rate this round)"
    if PRODUCER_NICE:
        note += f"; producer at nice {PRODUCER_NICE}"
    if achieved < 0.9 * offered:
        note += f"; the producer reached only {achieved:,.0f} jobs/s"
    return note


@contextlib.contextmanager
def running_all(procs: list[Proc]) -> Iterator[list[Proc]]:
    with contextlib.ExitStack() as stack:
        for p in procs:
            stack.enter_context(running(p))
        yield procs
