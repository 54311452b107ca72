"""Jobs that fail in every way a real worker process sees: overrunning their timeout (sync and
async), naming a task this worker does not know, carrying arguments that no longer fit, and
killing the worker process itself. None of them may hold up the good jobs around them."""

from __future__ import annotations

import json
import re
import signal

import pytest
from processrig import Rig, job_records, read_marker

from conveyor import JobState
from conveyor.backends.base import NewJob

pytestmark = pytest.mark.process


def test_timeouts_sync_and_async(rig: Rig) -> None:
    hang_marker, async_marker, good_marker = rig.marker("hang"), rig.marker("ahang"), rig.marker("good")
    hang = rig.task("hang").enqueue(str(hang_marker))  # sleeps 10 s, timeout 0.5 s, max_attempts 2
    ahang = rig.task("ahang").enqueue(str(async_marker))  # the same, async
    good = rig.task("record").enqueue(str(good_marker))

    # Each timed-out sync attempt keeps its thread (and slot) for 10 s: 2 of the 4 slots.
    w = rig.worker(concurrency=4, visibility_timeout=2, name="W")
    sync_dead = rig.wait_job(hang.id, timeout=20)
    async_dead = rig.wait_job(ahang.id, timeout=20)
    good_done = rig.wait_job(good.id, timeout=20)

    assert good_done.state is JobState.SUCCEEDED and good_done.attempts == 1
    for job in (sync_dead, async_dead):
        assert job.state is JobState.DEAD, job
        assert job.attempts == 2
        assert [(e["attempt"], e["kind"]) for e in job.errors] == [(1, "timeout"), (2, "timeout")]
        assert all("within its timeout of 0.5s" in e["message"] for e in job.errors)
    # The sync task could not be stopped, only abandoned; it never got to finish.
    hang_recs = read_marker(hang_marker)
    assert [(r["attempt"], r["event"]) for r in hang_recs] == [(1, "start"), (2, "start")]
    # The async task was really cancelled, at each attempt.
    async_events = sorted((r["attempt"], r["event"]) for r in read_marker(async_marker))
    assert async_events == [(1, "cancelled"), (1, "start"), (2, "cancelled"), (2, "start")]

    # Threads still sleeping past their timeout do not hold up shutdown.
    w.send(signal.SIGTERM)
    assert w.wait(10) == 0


def test_unknown_task_and_bad_arguments_go_dead_after_one_attempt(rig: Rig) -> None:
    marker = rig.marker()
    common = {"queue": "default", "max_attempts": 5, "timeout": 10}
    results = rig.app.backend.enqueue_many([
        NewJob(task="nope.missing", args="{}", **common),
        NewJob(task="record", args=json.dumps({"marker": str(marker), "bogus": 1}), **common),
        NewJob(task="record", args=json.dumps({"sleep": 1}), **common),  # required "marker" missing
        NewJob(task="record", args=json.dumps([str(marker)]), **common),  # not an object
    ])
    unknown, extra_arg, missing_arg, not_object = (r.id for r in results)
    good = rig.task("record").enqueue(str(marker))

    w = rig.worker(concurrency=2, name="W")
    rig.wait_jobs([unknown, extra_arg, missing_arg, not_object], states=[JobState.DEAD], timeout=20)
    assert rig.wait_job(good.id).state is JobState.SUCCEEDED

    expected = {unknown: "unknown_task", extra_arg: "bad_arguments", missing_arg: "bad_arguments",
                not_object: "bad_arguments"}
    for job_id, kind in expected.items():
        job = rig.job(job_id)
        assert job.attempts == 1, job
        assert [e["kind"] for e in job.errors] == [kind], job.errors
    assert "nope.missing" in rig.job(unknown).errors[0]["message"]
    assert "bogus" in rig.job(extra_arg).errors[0]["message"]
    assert "marker" in rig.job(missing_arg).errors[0]["message"]
    # None of the bad jobs reached the task.
    assert [r["job"] for r in read_marker(marker)] == [good.id]
    w.send(signal.SIGTERM)
    assert w.wait(10) == 0


def test_job_that_kills_its_worker_goes_dead_after_max_attempts(rig: Rig) -> None:
    """A task calling os._exit(1) takes the worker process down each time. The supervisor
    restarts it, each crash burns one attempt through lease expiry, and after max_attempts (3)
    the reaper sends the job to the dead-letter queue, while good jobs all get done."""
    crash_marker, good_marker = rig.marker("crash"), rig.marker("good")
    poison = rig.task("crash").enqueue(str(crash_marker))
    good = rig.task("record").enqueue_many([{"marker": str(good_marker), "sync": False}] * 50)

    sup = rig.worker(processes=2, concurrency=4, visibility_timeout=1, name="sup")
    dead = rig.wait_job(poison.id, timeout=45)
    assert dead.state is JobState.DEAD, dead
    assert dead.attempts == 3
    assert [(e["attempt"], e["kind"]) for e in dead.errors] == [
        (1, "lease_expired"), (2, "lease_expired"), (3, "lease_expired")]

    done = rig.wait_jobs([j.id for j in good], timeout=30)
    assert all(j.state is JobState.SUCCEEDED for j in done)
    crashes = job_records(read_marker(crash_marker), poison.id)
    assert [r["attempt"] for r in crashes] == [1, 2, 3]
    assert len({r["pid"] for r in crashes}) == 3, "each attempt runs in a fresh worker process"
    assert len(re.findall(r"exited with 1; restarting", sup.stderr())) >= 3
    assert rig.queue_stats().lease_expiries >= 3

    sup.send(signal.SIGTERM)
    assert sup.wait(20) == 0
