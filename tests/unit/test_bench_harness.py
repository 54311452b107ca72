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
