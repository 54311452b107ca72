"""A worker killed or frozen mid-job: the job is redelivered once its lease expires, and a
frozen worker that wakes up later (a zombie) cannot overwrite the new attempt's outcome."""

from __future__ import annotations

import re
import signal

import pytest
from processrig import Rig, job_records, read_marker

from conveyor import JobState

pytestmark = pytest.mark.process


def test_sigkill_mid_job_redelivers_after_lease_expiry(rig: Rig) -> None:
    marker = rig.marker()
    job = rig.task("record").enqueue(str(marker), sleep=30, fast_from_attempt=2)

    a = rig.worker(visibility_timeout=1, name="A")
    rig.wait_marker(marker, lambda recs: len(job_records(recs, job.id)) == 1, "attempt 1 to start on A")
    a.popen.kill()
    assert a.wait(10) == -signal.SIGKILL
    # The store still thinks A has it: nothing but the lease says otherwise.
    held = rig.job(job.id)
    assert held.state is JobState.RUNNING and held.attempts == 1

    b = rig.worker(visibility_timeout=1, name="B")
    done = rig.wait_job(job.id, timeout=20)

    assert done.state is JobState.SUCCEEDED, done
    assert done.attempts == 2
    assert done.result == {"attempt": 2, "pid": b.pid}
    assert [e["kind"] for e in done.errors] == ["lease_expired"]
    assert done.errors[0]["attempt"] == 1
    runs = [(r["attempt"], r["pid"]) for r in job_records(read_marker(marker), job.id)]
    assert runs == [(1, a.pid), (2, b.pid)]
    assert rig.queue_stats("default").lease_expiries == 1

    b.send(signal.SIGTERM)
    assert b.wait(15) == 0


def test_zombie_worker_cannot_overwrite_the_new_attempt(rig: Rig) -> None:
    marker = rig.marker()
    # Attempt 1 sleeps 2.5 s then would return A's result; attempt 2 returns at once.
    job = rig.task("record").enqueue(str(marker), sleep=2.5, fast_from_attempt=2)

    a = rig.worker(visibility_timeout=1, name="A")
    rig.wait_marker(marker, lambda recs: len(job_records(recs, job.id)) == 1, "attempt 1 to start on A")
    rig.stop_outside_write(a)  # SIGSTOP: A is frozen, holding a lease it can no longer renew

    b = rig.worker(visibility_timeout=1, name="B")
    done = rig.wait_job(job.id, timeout=20)
    assert done.state is JobState.SUCCEEDED, done
    assert done.attempts == 2
    assert done.result == {"attempt": 2, "pid": b.pid}
    assert [e["kind"] for e in done.errors] == ["lease_expired"]
    # Stop B, so that from here on only the zombie could possibly write to this job.
    b.send(signal.SIGTERM)
    assert b.wait(15) == 0
    snapshot_row = rig.row(job.id)
    snapshot = rig.job(job.id)

    a.send(signal.SIGCONT)
    # A wakes up: its heartbeat or its ack is refused by the store, and it logs so.
    refused = re.compile(rf"job {job.id} record: .*lease (was )?lost")
    rig.wait_until(lambda: refused.search(a.stderr()), 15, "A to log that its lease was lost")
    # Let attempt 1 finish its sleep on A too (its thread runs on whatever the worker decided).
    rig.wait_marker(marker, lambda recs: any(r["job"] == job.id and r["event"] == "end" and r["pid"] == a.pid
                                             for r in recs), "attempt 1 to finish its sleep on A")

    a.send(signal.SIGTERM)
    assert a.wait(15) == 0

    assert rig.row(job.id) == snapshot_row  # byte for byte what B left
    after = rig.job(job.id)
    assert (after.state, after.result, after.attempts, after.finished_at, after.errors) == (
        snapshot.state, snapshot.result, snapshot.attempts, snapshot.finished_at, snapshot.errors
    )
    runs = [(r["attempt"], r["pid"]) for r in job_records(read_marker(marker), job.id)]
    assert runs == [(1, a.pid), (2, b.pid)]
    assert "Traceback" not in a.stderr()
    assert rig.queue_stats("default").lease_expiries == 1
