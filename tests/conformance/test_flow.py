"""Flow control on every backend: no head-of-line blocking (priority inside a queue, strict
queue order), stopping sync tasks by flag, and retention of dead jobs."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from support import running_worker, wait_for_job, wait_until

from conveyor import Conveyor, JobState, Reject, current_job
from conveyor.backends.base import LoopClaims
from conveyor.worker import plan_strict

CONCURRENCY = 4


def _starts_between(app: Conveyor, task: str, after: float, before: float) -> list[float]:
    """Start times (seconds after ``after``) of the jobs of ``task`` that started inside the
    window, read from the store."""
    starts: list[float] = []
    cursor = None
    while True:
        page = app.backend.list_jobs(task=task, cursor=cursor, limit=500)
        starts += [round(j.attempted_at - after, 4) for j in page.jobs
                   if j.attempted_at is not None and after < j.attempted_at <= before]
        if page.next_cursor is None:
            return sorted(starts)
        cursor = page.next_cursor


@pytest.mark.needs("lookup")
def test_high_priority_jobs_overtake_a_10000_job_backlog(app: Conveyor) -> None:
    @app.task(name="slow_low")
    def slow_low(n: int) -> None:
        time.sleep(0.02)

    @app.task(name="urgent")
    def urgent(n: int) -> int:
        return n

    slow_low.options(priority=10).enqueue_many([(i,) for i in range(10_000)])
    with running_worker(app, concurrency=CONCURRENCY, grace_period=1):
        wait_until(lambda: app.backend.stats().queues[0].succeeded >= 20, timeout=30, message="backlog flowing")
        high = urgent.options(priority=-10).enqueue_many([(i,) for i in range(10)])
        # From here a claim surely sees them. Their created_at is earlier: when the enqueue
        # began (PostgreSQL's now() is the transaction's start), and a claim in the gap before
        # the commit rightly takes the backlog.
        visible_at = time.time()
        done = [wait_for_job(app, j.id, timeout=30) for j in high]
    assert all(j.state is JobState.SUCCEEDED for j in done)
    high_starts = sorted(round((j.attempted_at or 0) - visible_at, 4) for j in done)
    # Only claims already in flight when the urgent jobs became visible, and the one claim that
    # took the last urgent job together with backlog jobs, may start a backlog job by the time
    # the last urgent one started: at most one per slot.
    low_starts = _starts_between(app, "slow_low", visible_at, visible_at + high_starts[-1])
    assert len(low_starts) <= CONCURRENCY, (low_starts, high_starts)
    backlog = {q.queue: q for q in app.backend.stats().queues}["default"]
    assert backlog.available > 9_000  # the backlog was still there: the urgent jobs jumped it


@pytest.mark.needs("lookup")
def test_strict_queue_order_serves_high_before_a_low_backlog(app: Conveyor) -> None:
    @app.task(name="bulk", queue="low")
    def bulk(n: int) -> None:
        time.sleep(0.02)

    @app.task(name="vip", queue="high")
    def vip(n: int) -> int:
        return n

    bulk.enqueue_many([(i,) for i in range(2_000)])
    with running_worker(app, queues="high:2,low:1", strict=True, concurrency=CONCURRENCY, grace_period=1):
        wait_until(lambda: any(q.queue == "low" and q.succeeded >= 20 for q in app.backend.stats().queues),
                   timeout=30, message="low queue flowing")
        high = vip.enqueue_many([(i,) for i in range(10)])
        visible_at = time.time()  # see the test above
        done = [wait_for_job(app, j.id, timeout=30) for j in high]
    high_starts = sorted(round((j.attempted_at or 0) - visible_at, 4) for j in done)
    low_starts = _starts_between(app, "bulk", visible_at, visible_at + high_starts[-1])
    assert len(low_starts) <= CONCURRENCY, (low_starts, high_starts)


def test_plan_strict_gives_every_slot_to_the_heaviest_queue() -> None:
    assert plan_strict(5, {"low": 1, "high": 6, "default": 3}) == [("high", 5), ("default", 0), ("low", 0)]
    assert plan_strict(2, {"a": 1, "b": 1}) == [("a", 2), ("b", 0)]  # ties keep the listed order


@pytest.mark.needs("cancel")
def test_a_sync_task_sees_its_cancellation_and_stops(app: Conveyor) -> None:
    started = threading.Event()
    returned = threading.Event()
    checks = []

    @app.task(name="polite", timeout=60)
    def polite() -> str:
        ctx = current_job()
        assert ctx is not None
        started.set()
        while not ctx.cancelled:
            checks.append(1)
            time.sleep(0.01)
        returned.set()
        return "stopped early"

    job = polite.enqueue()
    with running_worker(app, concurrency=1, visibility_timeout=0.3) as wt:
        assert started.wait(10)
        assert app.cancel(job.id)
        assert returned.wait(10), "the sync task never saw the flag"
        wait_until(lambda: wt.worker.counters.by_task["polite:cancelled"] == 1, message="counted as cancelled")
    final = app.get_job(job.id)
    assert final.state is JobState.CANCELLED and final.result is None  # its late return changed nothing
    assert not app.cancel(job.id)  # already finished
    assert checks  # it really ran and polled


@pytest.mark.needs("lookup")
def test_dead_jobs_are_pruned_after_dead_ttl(make_app: object) -> None:
    app: Conveyor = make_app(dead_ttl=0.5, result_ttl=3600)  # type: ignore[operator]

    @app.task(name="doomed")
    def doomed() -> None:
        raise Reject("no")

    @app.task(name="fine")
    def fine() -> None: ...

    dead = doomed.enqueue()
    ok = fine.enqueue()
    with running_worker(app, concurrency=2, prune_interval=0.1):
        assert wait_for_job(app, dead.id).state is JobState.DEAD
        wait_until(lambda: app.backend.get(dead.id) is None, timeout=10, message="dead job pruned after dead_ttl")
        assert app.get_job(ok.id).state is JobState.SUCCEEDED  # result_ttl not reached: kept


@pytest.mark.needs("lookup")
def test_a_sync_task_past_its_timeout_is_told_to_stop(app: Conveyor) -> None:
    returned = threading.Event()

    @app.task(name="overrun", timeout=0.3, max_attempts=1)
    def overrun() -> None:
        ctx = current_job()
        assert ctx is not None
        deadline = time.monotonic() + 30
        while not ctx.cancelled and time.monotonic() < deadline:
            time.sleep(0.01)
        returned.set()

    job = overrun.enqueue()
    with running_worker(app, concurrency=1):
        done = wait_for_job(app, job.id)
        assert returned.wait(10), "the timed-out sync task was never told to stop"
    assert done.state is JobState.DEAD and done.errors[-1]["kind"] == "timeout"


@pytest.mark.needs("lookup")
def test_a_failed_claim_on_one_queue_does_not_strand_jobs_claimed_from_another(app: Conveyor) -> None:
    """Fault injection around the real store: the second queue's claim fails once."""
    from conveyor import StoreError

    @app.task(name="on_a", queue="a")
    def on_a() -> str:
        return "ran"

    job = on_a.enqueue()
    backend = app.backend
    real_claim = backend.claim
    failed: list[str] = []

    def flaky_claim(queue: str, limit: int, **kw: object) -> list[object]:
        if queue == "b" and not failed:
            failed.append(queue)
            raise StoreError("injected: the store blinked")
        return real_claim(queue, limit, **kw)  # type: ignore[arg-type]

    # A store whose worker claims from its event loop (Backend.loop_claims) fails there too.
    real_loop_claims = backend.loop_claims

    class FlakyLoopClaims:
        def __init__(self, near: LoopClaims) -> None:
            self.near = near

        async def ack_and_claim(self, acks: Any, queue: str, limit: int, **kw: Any) -> Any:
            if queue == "b" and not failed:
                failed.append(queue)
                raise StoreError("injected: the store blinked")
            return await self.near.ack_and_claim(acks, queue, limit, **kw)

        def close(self) -> None:
            self.near.close()

    def flaky_loop_claims() -> FlakyLoopClaims | None:
        near = real_loop_claims()
        return None if near is None else FlakyLoopClaims(near)

    backend.claim = flaky_claim  # type: ignore[assignment, method-assign]
    backend.loop_claims = flaky_loop_claims  # type: ignore[assignment, method-assign]
    try:
        with running_worker(app, queues="a:2,b:1", strict=True, concurrency=4):
            done = wait_for_job(app, job.id, timeout=10)
    finally:
        backend.claim = real_claim  # type: ignore[method-assign]
        backend.loop_claims = real_loop_claims  # type: ignore[method-assign]
    assert failed == ["b"]
    assert done.state is JobState.SUCCEEDED and done.attempts == 1 and done.errors == []
