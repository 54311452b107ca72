"""Worker prefetch: jobs claimed beyond the free slots are held (leased, heartbeated) and start
when a slot frees; never more than ``concurrency`` run at once; a stop releases the held ones
unrun; a held job that is cancelled never runs; one held for ``prefetch_hold`` without a slot
is given back, for an idle worker to run. On every backend."""

from __future__ import annotations

import threading
import time

import pytest
from support import WorkerThread, running_worker, wait_for_job, wait_until

from conveyor import Conveyor, ConveyorError, JobState
from conveyor.worker import Worker


def running_in_store(app: Conveyor) -> int:
    return sum(q.running for q in app.backend.stats(finished=False).queues)


@pytest.mark.needs("lookup")
def test_prefetch_runs_every_job_once_and_never_more_than_concurrency(app: Conveyor) -> None:
    lock = threading.Lock()
    now_running = 0
    peak = 0
    peak_leased = 0

    @app.task(name="counted")
    def counted(i: int) -> int:
        nonlocal now_running, peak, peak_leased
        with lock:
            now_running += 1
            peak = max(peak, now_running)
        peak_leased = max(peak_leased, running_in_store(app))  # running + held, as the store sees them
        time.sleep(0.02)
        with lock:
            now_running -= 1
        return i

    jobs = counted.enqueue_many([(i,) for i in range(30)])
    with running_worker(app, concurrency=2, prefetch=4) as wt:
        done = [wait_for_job(app, j.id, timeout=30) for j in jobs]
    assert [j.state for j in done] == [JobState.SUCCEEDED] * 30
    assert [j.result for j in done] == list(range(30))
    assert all(j.attempts == 1 for j in done)
    assert peak <= 2
    assert peak_leased > 2, "no job was ever held beyond the running ones: prefetch did nothing"
    assert peak_leased <= 2 + 4
    assert wt.worker.counters.claimed == 30


@pytest.mark.needs("lookup")
def test_a_stop_releases_the_held_jobs_unrun(app: Conveyor) -> None:
    started = threading.Event()
    go_on = threading.Event()
    ran: list[int] = []

    @app.task(name="first_blocks")
    def first_blocks(i: int) -> int:
        ran.append(i)
        if i == 0:
            started.set()
            go_on.wait(10)
        return i

    # A higher priority, so it runs first on a broker too (its own lane, claimed first),
    # where jobs of one lane are not handed out by id.
    first = first_blocks.options(priority=-1).enqueue(0)
    held = first_blocks.enqueue_many([(i,) for i in (1, 2, 3)])
    wt = WorkerThread(app, concurrency=1, prefetch=3, prefetch_hold=60).start()
    try:
        assert started.wait(10)
        wait_until(lambda: running_in_store(app) == 4, message="the three jobs held beside the running one")
        wt.stop()  # graceful: the running job finishes, the held ones go back
        time.sleep(0.2)
        go_on.set()
        wt.join()
    finally:
        go_on.set()
    assert ran == [0]
    assert app.get_job(first.id).state is JobState.SUCCEEDED
    for job in held:
        back = app.get_job(job.id)
        assert back.state is JobState.AVAILABLE
        assert back.attempts == 0  # released unrun: the attempt does not count
    assert wt.worker.counters.released == 3


@pytest.mark.needs("cancel", "lookup")
def test_a_cancelled_held_job_never_runs(app: Conveyor) -> None:
    started = threading.Event()
    go_on = threading.Event()
    ran: list[str] = []

    @app.task(name="blocker")
    def blocker() -> None:
        ran.append("blocker")
        started.set()
        go_on.wait(10)

    @app.task(name="victim")
    def victim() -> None:
        ran.append("victim")

    @app.task(name="after")
    def after() -> None:
        ran.append("after")

    first = blocker.options(priority=-1).enqueue()  # claimed first, on a broker too
    doomed = victim.enqueue()
    with running_worker(app, concurrency=1, prefetch=1, prefetch_hold=60, visibility_timeout=0.6) as wt:
        assert started.wait(10)
        wait_until(lambda: running_in_store(app) == 2, message="the victim held beside the blocker")
        assert app.backend.cancel(doomed.id)
        wait_until(lambda: wt.worker.counters.by_task["victim:cancelled"] == 1,
                   message="the heartbeat to drop the cancelled held job")
        go_on.set()
        wait_for_job(app, first.id)
        wait_for_job(app, after.enqueue().id)
    assert ran == ["blocker", "after"]
    assert app.get_job(doomed.id).state is JobState.CANCELLED


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_prefetch_must_be_a_count(app: Conveyor, bad: object) -> None:
    with pytest.raises(ConveyorError, match="prefetch"):
        Worker(app, prefetch=bad)  # type: ignore[arg-type]


@pytest.mark.needs("lookup")
def test_a_job_held_past_prefetch_hold_goes_back_for_an_idle_worker(app: Conveyor) -> None:
    """A long job fills the one slot: the two jobs held beside it go back to the queue unrun
    after prefetch_hold, the worker claims no more while its slot stays busy, and a second
    worker runs them meanwhile."""
    started = threading.Event()
    go_on = threading.Event()
    ran: list[tuple[str, int]] = []

    @app.task(name="first_is_long")
    def first_is_long(i: int) -> int:
        ran.append((threading.current_thread().name, i))
        if i == 0:
            started.set()
            go_on.wait(20)
        return i

    first = first_is_long.options(priority=-1).enqueue(0)  # claimed first, on a broker too
    held = first_is_long.enqueue_many([(1,), (2,)])
    hoarder = WorkerThread(app, concurrency=1, prefetch=2, prefetch_hold=0.3, visibility_timeout=5.0).start()
    try:
        assert started.wait(10)
        wait_until(lambda: hoarder.worker.counters.released == 2, timeout=10,
                   message="the two held jobs given back after prefetch_hold")
        for job in held:
            back = app.get_job(job.id)
            assert back.state is JobState.AVAILABLE
            assert back.attempts == 0  # given back unrun: the attempt does not count
        # Its slot still busy, the worker does not claim them (or others) back into the wait.
        time.sleep(0.5)
        assert running_in_store(app) == 1
        assert hoarder.worker.counters.claimed == 3
        with running_worker(app, concurrency=2) as idle:
            done = [wait_for_job(app, j.id, timeout=10) for j in held]
        assert [j.state for j in done] == [JobState.SUCCEEDED] * 2
        assert [j.attempts for j in done] == [1, 1]
        assert idle.worker.counters.succeeded == 2
        assert app.get_job(first.id).state is JobState.RUNNING
    finally:
        go_on.set()
        hoarder.stop()
        hoarder.join()
    assert app.get_job(first.id).state is JobState.SUCCEEDED
    assert sorted(i for _, i in ran) == [0, 1, 2]
    assert hoarder.worker.counters.succeeded == 1


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_prefetch_hold_must_be_positive(app: Conveyor, bad: float) -> None:
    with pytest.raises(ConveyorError, match="prefetch_hold"):
        Worker(app, prefetch=1, prefetch_hold=bad)



@pytest.mark.needs("clock", "lookup")
def test_a_held_job_that_starts_is_reported_started_soon(app: Conveyor) -> None:
    """A job claimed into the prefetch is not counted as an attempt until the store knows it
    started: once a slot frees and it starts, the worker reports it (a heartbeat of its lease,
    within about worker.MARK_SPACING_S), long before the regular heartbeat (a third of the
    lease). From then on its lease running out counts the attempt (max_attempts=1: dead)."""
    go_first, go_second = threading.Event(), threading.Event()
    second_started = threading.Event()

    @app.task(name="two_blockers", max_attempts=1)
    def two_blockers(i: int) -> int:
        if i == 1:
            second_started.set()
        (go_second if i else go_first).wait(30)
        return i

    first, second = two_blockers.enqueue_many([(0,), (1,)])

    def lease_end() -> float:
        job = app.backend.get(second.id)
        assert job is not None and job.lease_expires_at is not None
        return job.lease_expires_at

    try:
        with running_worker(app, concurrency=1, prefetch=1, prefetch_hold=600.0, visibility_timeout=120.0):
            wait_until(lambda: running_in_store(app) == 2, timeout=10)  # one running, one held
            claimed_until = lease_end()
            go_first.set()  # the slot frees and the held job starts
            wait_until(second_started.is_set, timeout=10)
            # Reported started: its lease renewed, 40 s before the regular heartbeat would.
            wait_until(lambda: lease_end() > claimed_until, timeout=10)
            # The first job's ack goes out in a group, a moment later: until it lands, its lease
            # (older than the second's) would be reaped too.
            wait_until(lambda: getattr(app.backend.get(first.id), "state", None)
                       is JobState.SUCCEEDED, timeout=10)
            reaped = app.backend.reap(now=lease_end() + 1)
            assert reaped.dead == [second.id]
            go_second.set()
    finally:
        go_first.set()
        go_second.set()
    job = app.backend.get(second.id)
    assert job is not None and job.state is JobState.DEAD
    assert (job.attempts, job.stalls) == (1, 0)
    assert "mid-job" in job.errors[-1]["message"]
