"""``conveyor worker --burst`` (RQ's ``--burst``): runs what its queues hold, jobs enqueued
meanwhile included, and exits 0 once they have no available or due job and its own have
finished."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from processrig import Rig

from conveyor import JobState

pytestmark = pytest.mark.process


def starts(marker: Path) -> list[int]:
    if not marker.exists():
        return []
    return [json.loads(line)["job"] for line in marker.read_text().splitlines()
            if json.loads(line)["event"] == "start"]


def test_burst_worker_exits_0_once_the_queue_is_empty(rig: Rig) -> None:
    marker = rig.tmp / "marks"
    jobs = [rig.task("record").enqueue(str(marker)) for _ in range(5)]
    later = rig.task("record").options(delay=3600).enqueue(str(marker))
    proc = rig.spawn("worker", "--burst", "--queues", "default", "--concurrency", "2",
                     name="W")
    assert proc.wait(30) == 0, proc.stderr()
    assert [rig.job(j.id).state for j in jobs] == [JobState.SUCCEEDED] * 5
    assert rig.job(later.id).state is JobState.SCHEDULED  # not due: it does not keep it running
    assert "stopping (burst)" in proc.stderr()


def test_burst_worker_runs_a_job_enqueued_while_it_runs(rig: Rig) -> None:
    marker, gate = rig.tmp / "marks", rig.tmp / "gate"
    first = rig.task("record").enqueue(str(marker), sleep=30, gate=str(gate))
    proc = rig.spawn("worker", "--burst", "--queues", "default", "--poll-interval", "0.2",
                     name="W")
    rig.wait_until(lambda: starts(marker) == [first.id], 20, "the first job to start")
    second = rig.task("record").enqueue(str(marker))
    rig.wait_until(lambda: second.id in starts(marker), 20, "the second job to start")
    assert proc.alive()  # the first still runs
    gate.touch()
    assert proc.wait(30) == 0, proc.stderr()
    assert rig.job(first.id).state is JobState.SUCCEEDED
    assert rig.job(second.id).state is JobState.SUCCEEDED


def test_burst_worker_on_an_empty_store_exits_at_once(rig: Rig) -> None:
    proc = rig.spawn("worker", "--burst", "--queues", "default", name="W")
    assert proc.wait(20) == 0, proc.stderr()


def test_burst_worker_refuses_processes(rig: Rig) -> None:
    result = rig.cli("worker", "--burst", "--processes", "2")
    assert result.returncode == 2, result.stderr
    assert "--burst" in result.stderr and "Traceback" not in result.stderr
