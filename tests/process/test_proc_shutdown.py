"""SIGTERM stops claiming, lets running jobs finish within the grace period and releases the
rest; a second signal hurries; a worker exits 0 either way."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from processrig import Rig, children_of, job_records, proc_stat, read_marker

from conveyor import JobState

pytestmark = pytest.mark.process


def test_sigterm_finishes_short_job_releases_long_one_and_claims_nothing(rig: Rig) -> None:
    marker, gate = rig.marker(), rig.tmp / "gate"
    record = rig.task("record")
    short = record.enqueue(str(marker), sleep=1.5)
    long = record.enqueue(str(marker), sleep=60, gate=str(gate))
    grace = 3.0

    a = rig.worker(concurrency=2, grace=grace, visibility_timeout=5, name="A")
    rig.wait_marker(marker, lambda recs: {r["job"] for r in recs} == {short.id, long.id}, "both jobs to start")
    a.send(signal.SIGTERM)
    t0 = time.monotonic()
    extra = record.enqueue(str(marker))  # enqueued after SIGTERM: A must not take it

    released = rig.wait_job(long.id, states=[JobState.AVAILABLE], timeout=grace + 5)
    elapsed = time.monotonic() - t0
    assert released.attempts == 0  # a release does not count as an attempt
    assert released.worker_id is None and released.lease_expires_at is None
    assert released.errors == []
    assert elapsed >= grace - 0.5, f"released after {elapsed:.2f}s, before the {grace}s grace period ended"
    assert elapsed <= grace + 3, f"released after {elapsed:.2f}s"
    assert a.wait(10) == 0

    done_short = rig.job(short.id)
    assert done_short.state is JobState.SUCCEEDED and done_short.attempts == 1
    never = rig.job(extra.id)
    assert never.state is JobState.AVAILABLE
    assert (never.attempts, never.attempted_at, never.worker_id) == (0, None, None), "claimed after SIGTERM"
    assert job_records(read_marker(marker), extra.id) == []
    assert "released 1 job(s)" in a.stderr()

    gate.touch()  # the long job's next run returns at once
    b = rig.worker(concurrency=2, name="B")
    rerun, extra_done = rig.wait_jobs([long.id, extra.id], timeout=20)
    assert rerun.attempts == 1 and rerun.result == {"attempt": 1, "pid": b.pid}
    assert extra_done.result == {"attempt": 1, "pid": b.pid}
    runs = [(r["attempt"], r["pid"]) for r in job_records(read_marker(marker), long.id)]
    assert runs == [(1, a.pid), (1, b.pid)]
    b.send(signal.SIGTERM)
    assert b.wait(15) == 0


def test_second_signal_hurries_shutdown_and_releases_the_job(rig: Rig) -> None:
    marker = rig.marker()
    job = rig.task("record").enqueue(str(marker), sleep=60)
    a = rig.worker(concurrency=2, grace=30, visibility_timeout=5, name="A")
    rig.wait_marker(marker, lambda recs: len(job_records(recs, job.id)) == 1, "the job to start")

    t0 = time.monotonic()
    a.send(signal.SIGTERM)
    a.send(signal.SIGINT)
    assert a.wait(10) == 0
    elapsed = time.monotonic() - t0
    assert elapsed < 3, f"a second signal should cut the 30 s grace short; exit took {elapsed:.2f}s"

    after = rig.job(job.id)
    if after.state is JobState.RUNNING:
        # Acceptable only if its lease will run out and the reaper requeues it.
        rig.wait_until(lambda: rig.app.backend.now() > (after.lease_expires_at or 0), 10, "the lease to expire")
        assert job.id in rig.app.backend.reap().requeued
        after = rig.job(job.id)
    else:
        assert after.attempts == 0, "a released job must not have its attempt counted"
    assert after.state is JobState.AVAILABLE


def sigint_pending(pid: int) -> bool:
    """True if SIGINT is pending (not yet delivered) for ``pid`` or any of its threads."""
    bit = 1 << (signal.SIGINT - 1)
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            lines = status.read_text().splitlines()
        except (FileNotFoundError, ProcessLookupError):
            continue
        for line in lines:
            key, _, value = line.partition(":")
            if key in ("SigPnd", "ShdPnd") and int(value.strip(), 16) & bit:
                return True
    return False


def test_ctrl_c_on_a_supervisor_is_one_graceful_stop(rig: Rig) -> None:
    """Ctrl-C in a terminal sends one SIGINT to every process of the foreground process group.
    That is one stop request: a running job must still get its grace period, not be released
    as if the user had pressed Ctrl-C twice.

    The tty delivers to the supervisor and its children in no set order; this test pins the
    order in which a child handles the tty's SIGINT before the supervisor handles its own
    (the supervisor is frozen meanwhile, its SIGINT pending).
    """
    marker = rig.marker()
    sup = rig.worker(processes=2, concurrency=2, grace=15, visibility_timeout=5, name="sup")
    children = children_of(sup.pid)
    assert len(children) == 2
    job = rig.task("record").enqueue(str(marker), sleep=1.5)
    rig.wait_marker(marker, lambda recs: len(job_records(recs, job.id)) == 1, "the job to start")

    sup.send(signal.SIGSTOP)
    rig.wait_until(lambda: (proc_stat(sup.pid) or {}).get("state") == "T", 5, "the supervisor to stop")
    os.killpg(sup.pid, signal.SIGINT)  # what the terminal does on Ctrl-C (the group is the rig's own)
    rig.wait_until(lambda: not any(sigint_pending(c) for c in children), 5,
                   "the children to take delivery of the terminal's SIGINT")
    sup.send(signal.SIGCONT)
    assert sup.wait(20) == 0

    done = rig.job(job.id)
    assert "second stop request" not in sup.stderr(), sup.stderr()
    assert done.state is JobState.SUCCEEDED, f"one Ctrl-C released the running job: {done}"
    assert done.attempts == 1
