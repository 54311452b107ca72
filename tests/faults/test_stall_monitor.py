"""The stall monitor (stall_monitor.py) the soak's latency check relies on: it must see a CPU
taken away from the guest's ordinary tasks, where it was taken, and for about how long."""

from __future__ import annotations

import os
import time

import pytest
from stall_monitor import StallMonitor, hog

pytestmark = [pytest.mark.faults, pytest.mark.process]


def test_a_cpu_taken_away_shows_up_as_a_stall_on_that_cpu() -> None:
    if os.geteuid() != 0:
        with StallMonitor() as monitor:
            assert not monitor.available and monitor.why_not, "a canary ran without real-time priority"
        pytest.skip(f"real-time canaries need root: {monitor.why_not}")
    cpu = sorted(os.sched_getaffinity(0))[0]
    with StallMonitor() as monitor:
        assert monitor.available, monitor.why_not
        time.sleep(0.2)
        t0 = time.time()
        hog(cpu, 0.3).wait(10)
        t1 = time.time()
        time.sleep(0.2)
    mine = [s for s in monitor.stalls if s.cpu == cpu and s.start <= t1 and t0 <= s.end]
    assert mine, f"no stall seen on CPU {cpu} during a 300 ms real-time hog: {monitor.stalls}"
    longest = max(mine, key=lambda s: s.ms)
    # RT throttling leaves ordinary and lower real-time tasks 5 % of each second, so the canary
    # may get a turn inside the hog's window: it is seen as one long stall or a few.
    assert sum(s.ms for s in mine) >= 200, f"the stalls on CPU {cpu} add up to less than the hog: {mine}"
    assert monitor.overlaps(longest.start + 0.01, longest.start + 0.02, after=0.0)
    assert monitor.overlaps(longest.end + 0.03, longest.end + 0.04, after=0.05)
    assert not monitor.overlaps(t1 + 10, t1 + 11, after=0.05)
    summary = monitor.summary()
    assert summary["stalls"] == len(monitor.stalls) >= 1
