"""A worker whose every slot is held by a sync task hung past its timeout (threads cannot be
killed) is replaced: a single process exits non-zero after --stuck-grace so its supervisor
(systemd, Kubernetes) restarts it; under --processes N the supervisor restarts that child."""

from __future__ import annotations

import re

import pytest
from processrig import Rig

from conveyor import JobState
from conveyor.worker import EXIT_STUCK

pytestmark = pytest.mark.process


def test_single_worker_with_every_slot_stuck_exits_nonzero(rig: Rig) -> None:
    marker = rig.marker("hang")
    hung = [rig.task("hang").enqueue(str(marker), 300) for _ in range(2)]  # timeout 0.5 s
    w = rig.spawn("worker", "--concurrency", "2", "--visibility-timeout", "2", "--poll-interval", "0.2",
                  "--stuck-grace", "1", name="W")
    rig.wait_started(w)

    code = w.wait(60)
    assert code == EXIT_STUCK, rig.diagnosis()
    err = w.stderr()
    assert re.search(r"all 2 slot\(s\) stuck", err), err
    # The hung attempts were settled by their timeout; the worker held nothing else to give back.
    for job in hung:
        j = rig.job(job.id)
        assert j.state in (JobState.SCHEDULED, JobState.AVAILABLE), j
        assert [e["kind"] for e in j.errors] == ["timeout"]
    assert "still running at shutdown" not in err


def test_supervisor_restarts_the_child_whose_slots_are_all_stuck(rig: Rig) -> None:
    marker = rig.marker("hang")
    rig.task("hang").enqueue(str(marker), 300)
    sup = rig.spawn("worker", "--processes", "2", "--concurrency", "1", "--visibility-timeout", "2",
                    "--poll-interval", "0.2", "--stuck-grace", "1", name="S")
    rig.wait_started(sup, 2)

    # One child takes the hung job, is stuck, exits with EXIT_STUCK and is started again.
    rig.wait_until(lambda: sup.started_workers() >= 3, 60, "a third worker start (a restart)")
    err = sup.stderr()
    assert re.search(rf"worker process \d \(pid \d+\) exited with {EXIT_STUCK} \(every slot stuck\)", err), err
    assert sup.alive()
