"""The benchmark harness keeps going when one system's scenario fails (benchmarks/harness):
a broker dropping one peer's connection in one round once stopped the whole RabbitMQ run,
losing every other system's figures."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(autouse=True)
def bench_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """benchmarks/ first on the path, and its ``harness`` package in place of the fault tests'
    ``harness`` module (tests/faults/harness.py), which a whole run has imported by now."""
    monkeypatch.syspath_prepend(str(BENCH))
    for name in [n for n in sys.modules if n == "harness" or n.startswith("harness.")]:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [n for n in sys.modules if n.startswith("harness.")]:
        del sys.modules[name]  # the benchmarks' submodules; monkeypatch puts the module back


def test_a_failing_scenario_is_a_row_and_the_rounds_that_ran_make_the_median() -> None:
    from harness.common import Row, guarded, summarize
    from harness.report import tables

    def drain(system: str, rate: float) -> Row:
        return Row(system, "drain", 100, rate)

    def broken() -> Row:
        raise ConnectionResetError("connection reset by peer | broker")

    rounds = [
        [guarded("peer", "drain", drain, "peer", 10.0), guarded("conveyor", "drain", drain, "conveyor", 30.0)],
        [guarded("peer", "drain", broken), guarded("conveyor", "drain", drain, "conveyor", 31.0)],
        [guarded("peer", "drain", drain, "peer", 12.0), guarded("conveyor", "drain", drain, "conveyor", 29.0),
         guarded("peer", "latency", broken)],
    ]
    failed = rounds[1][0]
    assert failed.failed and failed.jobs_per_s is None
    assert failed.note.startswith("failed: ConnectionResetError") and "|" not in failed.note
    by = {(r.system, r.scenario): r for r in summarize(rounds)}
    assert by[("peer", "drain")].jobs_per_s == 11.0  # the median of the two rounds that ran
    assert by[("conveyor", "drain")].jobs_per_s == 30.0
    assert by[("peer", "latency")].failed  # failed in every round it ran: said, no figure
    text = "\n".join(tables(list(by.values())))
    assert "failed" in text


def test_an_error_that_is_not_an_exception_still_stops_the_run() -> None:
    from harness.common import Row, guarded

    def interrupted() -> Row:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        guarded("peer", "drain", interrupted)


def test_rows_made_positionally_are_not_failures() -> None:
    """Rows are built positionally (from_result): a field added in the middle once took the
    latency samples for a failure flag, and every idle latency showed 'failed'."""
    from harness.common import Row, from_result, summarize

    class Result:
        system, scenario, jobs, jobs_per_s, seconds = "conveyor", "latency", 3, None, None
        p50_ms, p99_ms, note, samples_ms = 1.0, 3.0, "wall clock", [1.0, 2.0, 3.0]

    row = from_result(Result())
    assert isinstance(row, Row) and not row.failed and row.samples_ms == [1.0, 2.0, 3.0]
    [summary] = summarize([[row]])
    assert not summary.failed and summary.p50_ms == 2.0


# -- what bounds a drain (benchmarks/harness/cpu.py): pure parts on fixed inputs ---------------
PROC_STAT_A = """cpu  1000 10 500 8000 100 5 5 20 0 0
cpu0 500 5 250 4000 50 3 2 10 0 0
cpu1 500 5 250 4000 50 2 3 10 0 0
intr 12345
ctxt 678
"""
# 0.5 s later on 2 cores (100 ticks): 90 ticks busy (60 user, 20 system, 5 softirq, 5 steal),
# 8 idle, 2 iowait
PROC_STAT_B = """cpu  1060 10 520 8008 102 5 10 25 0 0
cpu0 530 5 260 4004 51 3 4 12 0 0
cpu1 530 5 260 4004 51 2 6 13 0 0
intr 12399
"""


def test_the_machine_busy_share_comes_from_proc_stat_deltas() -> None:
    from harness.cpu import busy_share, parse_proc_stat

    a, b = parse_proc_stat(PROC_STAT_A), parse_proc_stat(PROC_STAT_B)
    assert a.cores == 2
    assert a.busy == 1000 + 10 + 500 + 5 + 5 + 20 and a.total == a.busy + 8000 + 100
    assert a.iowait == 100
    assert busy_share(a, b) == 0.9
    assert busy_share(b, b) is None  # no time passed: no share


def test_a_process_stat_line_whose_name_holds_spaces_and_parentheses() -> None:
    from harness.cpu import parse_pid_stat

    line = (
        "4242 (python -m (x) y) S 4200 4242 4242 0 -1 4194304 100 0 0 0 "
        "250 37 11 2 20 0 9 0 3527 222445568 7384 18446744073709551615"
    )
    t = parse_pid_stat(line)
    assert (t.ppid, t.own, t.children) == (4200, 287, 13)


def test_cpu_per_job_and_interpolation() -> None:
    from harness.cpu import interpolate, per_job_ms

    assert per_job_ms(1.5, 3000) == 0.5
    assert per_job_ms(None, 10) is None and per_job_ms(1.0, 0) is None
    ts, vs = [10.0, 10.1, 10.2], [0.0, 4.0, 6.0]
    assert interpolate(ts, vs, 10.05) == pytest.approx(2.0)
    assert interpolate(ts, vs, 10.15) == pytest.approx(5.0)
    assert interpolate(ts, vs, 9.0) == 0.0 and interpolate(ts, vs, 11.0) == 6.0  # clamped


def test_the_verdict() -> None:
    from harness.cpu import CPU_BOUND_BUSY, verdict

    assert CPU_BOUND_BUSY == 0.90
    assert verdict(0.97, 2) == "bound: CPU (machine 97 % busy of 2 cores)"
    assert verdict(0.90, 2).startswith("bound: CPU")
    assert verdict(0.896, 2).startswith("bound: CPU (machine 90 %")  # as shown, not below it
    assert verdict(0.894, 2).startswith("not CPU-bound (machine 89 %")
    assert verdict(0.64, 2) == "not CPU-bound (machine 64 % busy of 2 cores): round trips / locks"
    assert verdict(0.64, 2, waits="the write lock / fsync").endswith(": the write lock / fsync")
    # half the machine idle, but one Python worker process used a whole core
    assert verdict(0.62, 2, worker_max_core=0.98) == (
        "bound: one worker process's CPU (98 % of a core; machine 62 % busy of 2 cores)"
    )
    assert verdict(0.70, 2, 0.5, 0.95, "redis-server") == (
        "bound: redis-server CPU (95 % of a core; machine 70 % busy of 2 cores)"
    )
    assert verdict(0.70, 2, 0.5, 0.95, "").startswith("not CPU-bound")  # no server named
    assert verdict(None, 2) == "bound: not measured"


def _samples() -> list:  # type: ignore[type-arg]
    """Every 0.1 s on 2 cores (20 ticks per sample): worker 7 starts (30 ticks of start-up
    when first seen), then uses 8 ticks per sample, and is gone in the last sample (stopped);
    worker 8 uses 4 ticks per sample; the server 3; the driver 1; the machine is 18 of 20
    ticks busy."""
    from harness.cpu import MachineTicks, Sample

    out = []
    for k in range(8):
        w: dict[int, int] = {}
        if 1 <= k <= 6:
            w[7] = 30 + 8 * (k - 1)
        if k >= 1:
            w[8] = 4 * (k - 1)
        m = MachineTicks(busy=18 * k, total=20 * k, iowait=k, cores=2)
        out.append(Sample(100.0 + k / 10, m, w, 3 * k, {99: 3 * k}, driver=k))
    return out


def test_a_window_over_samples_counts_workers_server_and_machine() -> None:
    from harness.cpu import describe, window_of

    # 100.2 .. 100.6: both workers running throughout (worker 7 stops after 100.6)
    w = window_of(_samples(), 100.2, 100.6, 400)
    assert w is not None
    assert round(w.busy or 0, 6) == 0.9 and round(w.iowait or 0, 6) == 0.05
    assert round(w.worker_cpu_s or 0, 6) == 0.48  # 4 samples x (8 + 4) ticks
    assert round(w.server_cpu_s or 0, 6) == 0.12
    assert round(w.worker_max_core or 0, 6) == 0.8  # worker 7: 0.32 s in 0.4 s
    text, extra = describe(w, "redis-server")
    assert text == (
        "worker CPU 1.200 ms/job; redis-server CPU 0.300 ms/job; "
        "CPU of the 2 cores: workers 60 %, redis-server 15 %, driver 5 %, "
        "rest of the machine 10 %; "
        "bound: CPU (machine 90 % busy of 2 cores); coarse: a 0.40 s window"
    )
    assert extra["worker_cpu_ms_per_job"] == 1.2 and extra["machine_busy"] == 0.9
    assert extra["bound"] == "bound: CPU (machine 90 % busy of 2 cores)"  # others: 10 %
    # a worker gone from the last sample keeps what it used: no negative CPU after it stops
    w2 = window_of(_samples(), 100.55, 100.7, 100)
    assert w2 is not None and (w2.worker_cpu_s or 0) > 0
    # a window the sampler did not cover is not guessed at
    assert window_of(_samples(), 50.0, 51.0, 10) is None
    assert describe(None)[1]["bound"] == "bound: not measured"


def test_drain_rows_get_the_figures_and_the_report_shows_them() -> None:
    from harness.common import Row, summarize
    from harness.cpu import CpuSampler, Server, annotate
    from harness.report import bounds, markdown

    cpu = CpuSampler(Server("redis-server", 99, tree=False))
    cpu.samples = _samples()
    one = Row("conveyor", "drain", 400, 1000.0, note="store clock",
              extra={"window_start": 100.2, "window_end": 100.6})
    two = Row("conveyor", "drain_2p", 400, 1600.0, note="",
              extra={"window_start": 100.2, "window_end": 100.6})
    old = Row("peer", "drain", 400, 500.0, note="from a run before the CPU figures")
    other = Row("conveyor", "enqueue", 400, 9000.0, extra={"window_start": 100.2, "window_end": 100.6})
    annotate([one, two, old, other], cpu)
    assert one.note.startswith("store clock; worker CPU 1.200 ms/job; redis-server CPU")
    assert two.note.startswith("worker CPU")
    assert "bound" not in old.extra and "bound" not in other.extra  # no window / not a drain
    summary = summarize([[one, two, old, other]])
    table = "\n".join(bounds(summary))
    assert "| conveyor | 1 | 1,000 | - | 1.200 | 0.300 (redis-server) | 90 % | bound: CPU" in table
    assert "| conveyor | 2 | 1,600 | x1.60 (< x1.7) |" in table
    assert "| peer | 1 | 500 | - | - | - | - | - |" in table  # an old row: nothing invented
    env = {"date": "2025-01-01"}
    params = {"command": "x", "mode": "run", "jobs": 400, "rounds": 1, "latency_samples": 1,
              "load_seconds": 1.0, "concurrency": 8}
    md = markdown("redis", summary, [[one, two, old, other]], env, params, [])
    assert "## What bounds each drain" in md and "machine 90 % busy of 2 cores" in md


def test_the_in_process_worker_cpu_of_a_script_result_is_kept() -> None:
    from types import SimpleNamespace

    from harness.common import from_result

    result = SimpleNamespace(
        system="celery", scenario="drain", jobs=10, jobs_per_s=5.0, seconds=2.0, p50_ms=None,
        p99_ms=None, note="wall clock", samples_ms=[], cpu_ms_per_job=0.7,
        extra={"window_start": 1.0, "window_end": 3.0},
    )
    row = from_result(result)
    assert row.extra == {"window_start": 1.0, "window_end": 3.0,
                         "worker_cpu_ms_per_job_in_process": 0.7}


def test_a_cpu_bound_verdict_says_when_other_processes_took_much_of_it() -> None:
    from harness.cpu import MachineTicks, Sample, describe, window_of

    # 2 cores, 20 ticks a sample, 19 busy: worker 6, server 2, driver 1, other processes 10
    samples = [
        Sample(10.0 + k / 10, MachineTicks(19 * k, 20 * k, 0, 2), {5: 6 * k}, 2 * k, {9: 2 * k}, k)
        for k in range(10)
    ]
    text, extra = describe(window_of(samples, 10.1, 10.8, 700), "PostgreSQL")
    assert extra["others_share"] == 0.5
    assert extra["bound"] == "bound: CPU (machine 95 % busy of 2 cores, 50 % by other processes)"
    assert "rest of the machine 50 %" in text


def test_a_window_too_short_names_no_bound() -> None:
    from harness.cpu import describe, window_of

    w = window_of(_samples(), 100.2, 100.3, 100)
    text, extra = describe(w, "redis-server")
    assert extra["bound"] == "bound: not judged (a 0.10 s window is too short)"
    assert text.startswith("worker CPU") and text.endswith(extra["bound"])


def test_a_redis_drain_note_gives_one_server_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    """redis_bench's redis-server figure (from the worker's start) makes way for the one over
    the window; a bug once removed the new one too."""
    import os
    import time
    from types import SimpleNamespace

    pytest.importorskip("hiredis")
    from harness import redis_store
    from harness.cpu import Server

    def scenario_drain(s: object, a: object, tmp: object) -> SimpleNamespace:
        time.sleep(0.4)  # a window the sampler covers (no figure below is timed)
        now = time.time()
        return SimpleNamespace(
            system="conveyor", scenario="drain", jobs=100, jobs_per_s=100.0, seconds=1.0,
            p50_ms=None, p99_ms=None, samples_ms=[], cpu_ms_per_job=None,
            note="0.4s incl. process start; redis-server CPU 0.039 ms/job; body clock 9 jobs/s",
            extra={"window_start": now - 0.3, "window_end": now - 0.01},
        )

    from harness import cpu

    monkeypatch.setattr(redis_store.rb, "scenario_drain", scenario_drain)
    # No worker: in a whole test run, processes earlier tests started are this one's children.
    monkeypatch.setattr(cpu, "descendants", lambda pid: [])
    row = redis_store.drain(Server("redis-server", os.getpid(), tree=False), None, None, None)
    assert row.note.count("redis-server CPU") == 1
    assert "0.039" not in row.note and "server_cpu_ms_per_job" in row.extra
    assert row.note.startswith("0.4s incl. process start; body clock 9 jobs/s; redis-server CPU")


def test_the_paced_producer_runs_at_the_nice_asked_then_goes_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from harness import common

    before = os.getpriority(os.PRIO_PROCESS, 0)
    seen: list[int] = []
    monkeypatch.setattr(common, "PRODUCER_NICE", min(before + 5, 19))
    calls, _ = common.paced(1000.0, 0.003, lambda i: seen.append(os.getpriority(os.PRIO_PROCESS, 0)))
    assert calls == 3 and seen == [min(before + 5, 19)] * 3
    if os.geteuid() == 0:  # going back up needs CAP_SYS_NICE
        assert os.getpriority(os.PRIO_PROCESS, 0) == before
    assert "producer at nice" in common.load_note(100.0, 100.0)
    monkeypatch.setattr(common, "PRODUCER_NICE", 0)
    seen.clear()
    common.paced(1000.0, 0.002, lambda i: seen.append(os.getpriority(os.PRIO_PROCESS, 0)))
    assert set(seen) == {os.getpriority(os.PRIO_PROCESS, 0)}
    assert "producer at nice" not in common.load_note(100.0, 100.0)
