"""Several worker processes on one SQLite file, separately or under a ``--processes`` supervisor:
every job runs exactly once when no lease expires, the file stays sound, and the supervisor
replaces a crashed child and takes its children down with it."""

from __future__ import annotations

import os
import signal
from collections import Counter

import pytest
from processrig import Proc, Rig, children_of, proc_stat, read_marker, session_members

from conveyor import JobState

pytestmark = pytest.mark.process

N_JOBS = 2000


def drain_and_check(rig: Rig, worker_pids: set[int] | None = None) -> set[int]:
    """Enqueue N_JOBS, wait until all succeeded, check each ran exactly once; return the pids seen."""
    marker = rig.marker()
    jobs = rig.task("record").enqueue_many([(str(marker),)] * N_JOBS)
    ids = {j.id for j in jobs}
    assert len(ids) == N_JOBS

    rig.wait_until(lambda: rig.count("state = 'succeeded'") == N_JOBS, 60,
                   f"all {N_JOBS} jobs to succeed (stats: {rig.queue_stats()})")
    assert rig.count() == N_JOBS

    recs = read_marker(marker)
    runs = Counter(r["job"] for r in recs)
    assert set(runs) == ids
    duplicates = {job_id: n for job_id, n in runs.items() if n != 1}
    assert not duplicates, f"jobs run more than once: {duplicates}"
    assert all(r["attempt"] == 1 for r in recs)
    stats = rig.queue_stats()
    assert stats.lease_expiries == 0
    assert (stats.succeeded, stats.available, stats.running, stats.dead) == (N_JOBS, 0, 0, 0)
    assert rig.integrity() == "ok"
    pids = {r["pid"] for r in recs}
    if worker_pids is not None:
        assert pids <= worker_pids, f"jobs ran in unknown processes: {pids - worker_pids}"
    return pids


def test_four_worker_processes_share_one_file(rig: Rig) -> None:
    workers = [rig.worker(concurrency=8, visibility_timeout=10, name=f"w{i}", wait_started=False)
               for i in range(4)]
    for w in workers:
        rig.wait_started(w)
    pids = drain_and_check(rig, {w.pid for w in workers})
    assert len(pids) >= 2, f"only {pids} did any work"
    for w in workers:
        w.send(signal.SIGTERM)
    assert [w.wait(15) for w in workers] == [0, 0, 0, 0]


def test_supervisor_with_three_processes_shares_one_file(rig: Rig) -> None:
    sup = rig.worker(processes=3, concurrency=8, visibility_timeout=10, name="sup")
    children = set(children_of(sup.pid))
    assert len(children) == 3
    pids = drain_and_check(rig, children)
    assert len(pids) >= 2, f"only {pids} did any work"
    assert set(children_of(sup.pid)) == children, "no child should have been restarted"
    sup.send(signal.SIGTERM)
    assert sup.wait(20) == 0
    assert session_members(sup.pid) == []


def wait_children(rig: Rig, sup: Proc, count: int, without: frozenset[int] = frozenset()) -> list[int]:
    def check() -> list[int] | None:
        kids = children_of(sup.pid)
        return kids if len(kids) == count and not (set(kids) & without) else None

    return rig.wait_until(check, 15, f"{count} children of {sup.name} other than {sorted(without)}")


def test_supervisor_restarts_a_killed_child_and_stops_cleanly(rig: Rig) -> None:
    marker = rig.marker()
    sup = rig.worker(processes=2, concurrency=4, visibility_timeout=1, name="sup")
    first = wait_children(rig, sup, 2)
    victim = first[0]
    os.kill(victim, signal.SIGKILL)  # a child of our own supervisor

    now = wait_children(rig, sup, 2, without=frozenset({victim}))
    replacement = (set(now) - set(first)).pop()
    rig.wait_started(sup, 3)  # the replacement's worker loop runs too
    assert f"(pid {victim}) exited with -9; restarting" in sup.stderr()

    jobs = rig.task("record").enqueue_many([(str(marker),)] * 40)
    done = rig.wait_jobs([j.id for j in jobs], timeout=20)
    assert all(j.state is JobState.SUCCEEDED and j.attempts == 1 for j in done)
    ran_in = {r["pid"] for r in read_marker(marker)}
    assert ran_in <= set(now) and victim not in ran_in

    sup.send(signal.SIGTERM)
    assert sup.wait(20) == 0
    assert session_members(sup.pid) == []  # neither the original children nor the replacement
    assert all(proc_stat(pid) is None for pid in [*first, replacement])


def test_killed_supervisor_takes_its_children_down(rig: Rig) -> None:
    """SIGKILL on the supervisor cannot be passed on; its children must still not be orphaned."""
    marker = rig.marker()
    sup = rig.worker(processes=2, concurrency=2, visibility_timeout=5, grace=15, name="sup")
    children = children_of(sup.pid)
    job = rig.task("record").enqueue(str(marker), sleep=1.0)
    rig.wait_marker(marker, lambda recs: len(recs) == 1, "the job to start")

    sup.popen.kill()
    assert sup.wait(10) == -signal.SIGKILL
    # The children get SIGTERM (parent-death signal) and stop gracefully: the job finishes.
    rig.wait_until(lambda: session_members(sup.pid) == [], 20,
                   f"children {children} to exit after their supervisor was killed")
    done = rig.job(job.id)
    assert done.state is JobState.SUCCEEDED and done.attempts == 1, done
