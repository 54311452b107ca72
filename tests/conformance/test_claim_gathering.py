"""A busy worker with a backlog gathers freed slots for one claim (and its acks) instead of
claiming per freed slot; the gathering waits about one claim round trip at most, so a slot
freed beside jobs that stay busy is still used. On every backend."""

from __future__ import annotations

import threading

import pytest
from support import running_worker, wait_for_job

from conveyor import Conveyor, JobState


@pytest.mark.needs("lookup")
def test_a_freed_slot_is_used_while_the_other_slots_stay_busy(app: Conveyor) -> None:
    release = threading.Event()

    @app.task(name="holds")
    def holds(i: int) -> int:
        release.wait(60)
        return i

    @app.task(name="quick")
    def quick(i: int) -> int:
        return i

    held = holds.enqueue_many([(i,) for i in range(3)])
    quick_jobs = quick.enqueue_many([(i,) for i in range(40)])
    try:
        with running_worker(app, concurrency=4) as wt:
            # Three of four slots stay busy until the end: every quick job goes through the
            # fourth, one at a time, each claim after a gathering that finds no other slot.
            done = [wait_for_job(app, j.id, timeout=30) for j in quick_jobs]
            assert [j.state for j in done] == [JobState.SUCCEEDED] * 40
            assert [j.result for j in done] == list(range(40))
            assert [app.get_job(j.id).state for j in held] == [JobState.RUNNING] * 3
            release.set()
            finished = [wait_for_job(app, j.id, timeout=30) for j in held]
        assert [j.state for j in finished] == [JobState.SUCCEEDED] * 3
        assert wt.worker.counters.claimed == 43
    finally:
        release.set()


@pytest.mark.needs("lookup")
def test_a_backlog_of_short_jobs_drains_with_every_job_run_once(app: Conveyor) -> None:
    seen: list[int] = []
    lock = threading.Lock()

    @app.task(name="short")
    def short(i: int) -> int:
        with lock:
            seen.append(i)
        return i

    jobs = short.enqueue_many([(i,) for i in range(300)])
    with running_worker(app, concurrency=8) as wt:
        done = [wait_for_job(app, j.id, timeout=60) for j in jobs]
    assert [j.state for j in done] == [JobState.SUCCEEDED] * 300
    assert all(j.attempts == 1 for j in done)
    assert sorted(seen) == list(range(300))
    assert wt.worker.counters.claimed == 300
