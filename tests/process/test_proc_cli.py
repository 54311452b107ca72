"""The ``conveyor`` command line against a real store: each command does what it says, bad
input exits non-zero with a clear message and writes nothing."""

from __future__ import annotations

import json
import re
import signal

import pytest
from processrig import Rig, job_records, read_marker

from conveyor import JobState

pytestmark = pytest.mark.process


def test_enqueue_validates_and_stores(rig: Rig) -> None:
    marker = rig.marker()
    out = rig.cli("enqueue", "record", "--args", json.dumps([str(marker)]))
    assert out.returncode == 0, out.stderr
    m = re.fullmatch(r"enqueued job (\d+) \(record on default, available\)\n", out.stdout)
    assert m, out.stdout
    job = rig.job(int(m.group(1)))
    assert (job.task, job.queue, job.state, job.args) == ("record", "default", JobState.AVAILABLE,
                                                          {"marker": str(marker)})

    out = rig.cli("enqueue", "record", "--args", json.dumps({"marker": str(marker), "sleep": 0.5}),
                  "--queue", "other", "--delay", "60", "--json")
    assert out.returncode == 0, out.stderr
    printed = json.loads(out.stdout)
    stored = rig.job(printed["id"])
    assert (stored.queue, stored.state, stored.args["sleep"]) == ("other", JobState.SCHEDULED, 0.5)
    assert printed["state"] == "scheduled" and "lease_token" not in printed
    assert rig.count() == 2

    bad = {
        "unknown task": (["enqueue", "no.such.task", "--args", "[]"], "no task named 'no.such.task'"),
        "bad JSON": (["enqueue", "record", "--args", "[1,"], "not JSON"),
        "JSON scalar": (["enqueue", "record", "--args", "5"], "JSON list"),
        "args misfit": (["enqueue", "record", "--args", '{"bogus": 1}'], "arguments for task record"),
        "not JSON-able delay": (["enqueue", "record", "--args", "[]", "--delay", "soon"], "delay"),
    }
    for what, (args, message) in bad.items():
        out = rig.cli(*args)
        assert out.returncode != 0, f"{what}: exit 0\n{out.stdout}"
        assert message in out.stderr, f"{what}: {out.stderr!r}"
        assert "Traceback" not in out.stderr, f"{what}: {out.stderr}"
    assert rig.count() == 2, "a refused enqueue wrote something"


def test_stats_jobs_and_dlq_commands(rig: Rig) -> None:
    marker = rig.marker()
    rejects = rig.task("reject").enqueue_many([("bad input 1",), ("bad input 2",), ("bad input 3",)])
    ids = [j.id for j in rejects]
    w = rig.worker(name="W")
    rig.wait_jobs(ids, states=[JobState.DEAD])
    w.send(signal.SIGTERM)
    assert w.wait(10) == 0
    waiting = rig.task("record").enqueue_many([(str(marker),), (str(marker),)])

    out = rig.cli("stats", "--json")
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout)
    (default,) = [q for q in stats["queues"] if q["queue"] == "default"]
    assert (default["depth"], default["dead"], default["running"]) == (2, 3, 0)
    assert default["oldest_available_age"] is not None

    out = rig.cli("dlq", "list")
    assert out.returncode == 0, out.stderr
    assert "dead jobs (3 shown)" in out.stdout
    assert "rejected: bad input 2" in out.stdout
    out = rig.cli("dlq", "list", "--json")
    assert sorted(j["id"] for j in json.loads(out.stdout)) == ids

    out = rig.cli("dlq", "show", str(ids[0]))
    assert out.returncode == 0, out.stderr
    assert "dead" in out.stdout and "bad input 1" in out.stdout and "conveyor.errors.Reject" in out.stdout
    out = rig.cli("dlq", "show", "999999")
    assert out.returncode != 0 and "no job with id 999999" in out.stderr

    out = rig.cli("jobs", "show", str(ids[1]), "--json")
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    assert (shown["id"], shown["state"], shown["attempts"], shown["args"]) == (
        ids[1], "dead", 1, {"reason": "bad input 2"})
    assert [e["kind"] for e in shown["errors"]] == ["rejected"]
    assert "lease_token" not in shown

    # redrive one: back to available with attempts reset, its history kept
    out = rig.cli("dlq", "redrive", str(ids[0]))
    assert out.returncode == 0 and "redrove 1 job(s)" in out.stdout, out
    again = rig.job(ids[0])
    assert (again.state, again.attempts, again.finished_at) == (JobState.AVAILABLE, 0, None)
    assert [e["kind"] for e in again.errors] == ["rejected"]
    assert rig.job(ids[1]).state is JobState.DEAD
    # redriving a job that is not dead changes nothing and says so
    out = rig.cli("dlq", "redrive", str(waiting[0].id))
    assert out.returncode == 0 and "redrove 0 job(s)" in out.stdout
    assert rig.job(waiting[0].id).state is JobState.AVAILABLE
    out = rig.cli("dlq", "redrive")
    assert out.returncode != 0 and "give job ids, or --all" in out.stderr

    out = rig.cli("dlq", "redrive", "--all")
    assert out.returncode == 0 and "redrove 2 job(s)" in out.stdout, out
    assert [rig.job(i).state for i in ids] == [JobState.AVAILABLE] * 3

    # let them fail again, then purge the dead-letter queue
    w = rig.worker(name="W2")
    rig.wait_jobs(ids, states=[JobState.DEAD])
    rig.wait_jobs([j.id for j in waiting])
    w.send(signal.SIGTERM)
    assert w.wait(10) == 0
    assert all(rig.job(i).meta.get("redriven") for i in ids)
    out = rig.cli("dlq", "purge", "--yes")
    assert out.returncode == 0 and "purged 3 dead job(s)" in out.stdout, out
    assert rig.count("state = 'dead'") == 0
    assert rig.count() == 2  # the succeeded jobs are untouched
    assert len(read_marker(marker)) == 2


def test_jobs_cancel_waiting_and_running(rig: Rig) -> None:
    marker = rig.marker()
    record = rig.task("record")
    waiting = record.options(delay=3600).enqueue(str(marker))
    out = rig.cli("jobs", "cancel", str(waiting.id))
    assert out.returncode == 0 and f"cancelled job {waiting.id}" in out.stdout, out
    assert rig.job(waiting.id).state is JobState.CANCELLED
    out = rig.cli("jobs", "cancel", str(waiting.id))
    assert out.returncode != 0 and "already finished" in out.stderr

    # A running job: the worker loses its lease at its next heartbeat and stops it.
    long = record.enqueue(str(marker), sleep=3)
    w = rig.worker(concurrency=2, visibility_timeout=1, name="W")
    rig.wait_marker(marker, lambda recs: len(job_records(recs, long.id)) == 1, "the job to start")
    out = rig.cli("jobs", "cancel", str(long.id))
    assert out.returncode == 0, out
    cancelled_row = rig.row(long.id)
    rig.wait_until(lambda: re.search(rf"job {long.id} record: cancelled; stopped it", w.stderr()), 10,
                   "the worker to notice the cancel")
    rig.wait_marker(marker, lambda recs: len(job_records(recs, long.id, "end")) == 1,
                    "the task's thread to end", timeout=10)
    # The worker's late outcome changed nothing, and it still runs new jobs.
    after = rig.job(long.id)
    assert after.state is JobState.CANCELLED and after.result is None
    assert rig.row(long.id) == cancelled_row
    nxt = record.enqueue(str(marker))
    assert rig.wait_job(nxt.id).state is JobState.SUCCEEDED
    w.send(signal.SIGTERM)
    assert w.wait(10) == 0
