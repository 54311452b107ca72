"""History kept in the store (backends/history.py): additive minute rows the workers flush,
rolled up into hours after a day and deleted after ``history_days``, on every backend."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable

import pytest
from support import T0, new_job, running_worker, wait_until

from conveyor import Conveyor, Retry, RetryPolicy
from conveyor.backends.base import Backend, HistoryPoint
from conveyor.backends.history import HOUR, MINUTE, rollup_cutoff
from conveyor.retention import PRUNE_LOCK, Pruner

DAY = 86400.0
M0 = int(T0) - int(T0) % HOUR  # a whole hour


def totals(points: list[HistoryPoint]) -> dict[str, tuple[int, int, int, float, float]]:
    out: dict[str, list[float]] = {}
    for p in points:
        row = out.setdefault(p.queue, [0, 0, 0, 0.0, 0.0])
        for i, v in enumerate((p.processed, p.failed, p.dead, p.wait_sum, p.run_sum)):
            row[i] += v
    return {q: (int(r[0]), int(r[1]), int(r[2]), round(r[3], 6), round(r[4], 6))
            for q, r in out.items()}


def pt(queue: str, at: int, processed: int = 0, failed: int = 0, dead: int = 0,
       wait: float = 0.0, run: float = 0.0) -> HistoryPoint:
    return HistoryPoint(queue=queue, at=at, processed=processed, failed=failed, dead=dead,
                        wait_sum=wait, run_sum=run)


@pytest.mark.needs("history")
def test_additive_upserts_from_two_workers_agree(backend: Backend,
                                                 open_store: Callable[[], Backend]) -> None:
    other = open_store()
    try:
        def flushes(b: Backend) -> None:
            for i in range(40):
                b.record_history([pt("default", M0, processed=1, wait=0.5, run=0.25),
                                  pt("mail", M0 + MINUTE * (i % 3), failed=1, dead=i % 2)])

        threads = [threading.Thread(target=flushes, args=(b,)) for b in (backend, other)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got = backend.history(since=M0, until=M0 + HOUR)
        seen_by_other = other.history(since=M0, until=M0 + HOUR)
    finally:
        other.close()
    assert totals(got) == {"default": (80, 0, 0, 40.0, 20.0), "mail": (0, 80, 40, 0.0, 0.0)}
    assert got == seen_by_other
    assert [(p.at, p.span) for p in got if p.queue == "default"] == [(M0, MINUTE)]
    assert sorted(p.at for p in got if p.queue == "mail") == [M0, M0 + 60, M0 + 120]
    assert got == sorted(got, key=lambda p: (p.at, p.queue))


@pytest.mark.needs("history")
def test_one_flush_may_carry_a_minute_twice_and_reads_filter_by_queue_and_range(
        backend: Backend) -> None:
    backend.record_history([pt("a", M0, processed=2), pt("a", M0, processed=3, failed=1),
                            pt("b", M0 + MINUTE, dead=1)])
    assert totals(backend.history(since=M0, until=M0 + HOUR)) == {
        "a": (5, 1, 0, 0.0, 0.0), "b": (0, 0, 1, 0.0, 0.0)}
    assert totals(backend.history(queue="b", since=M0, until=M0 + HOUR)) == {
        "b": (0, 0, 1, 0.0, 0.0)}
    # A bucket belongs to the range its start is in: [since, until).
    assert backend.history(since=M0 + 1, until=M0 + MINUTE) == []
    assert [p.queue for p in backend.history(since=M0, until=M0 + MINUTE)] == ["a"]
    with pytest.raises(ValueError):
        backend.record_history([pt("a", M0 + 1, processed=1)])


@pytest.mark.needs("history")
def test_rollup_keeps_totals_and_leaves_the_last_day_in_minutes(backend: Backend) -> None:
    now = float(M0 + 2 * DAY + 30 * MINUTE)
    old = [pt(q, M0 + i * MINUTE, processed=i, failed=1, dead=i % 2, wait=i * 0.5, run=0.125)
           for i in range(150) for q in ("a", "b")]  # two and a half hours, two days ago
    recent = [pt("a", int(now) - int(now) % MINUTE - i * MINUTE, processed=7) for i in range(5)]
    backend.record_history(old + recent)
    before = totals(backend.history(since=0, until=now + DAY))

    rolled = backend.rollup_history(keep_days=7, limit=10_000, now=now)

    after = backend.history(since=0, until=now + DAY)
    assert rolled == len(old)
    assert totals(after) == before
    hours = [p for p in after if p.span == HOUR]
    assert sorted({p.at for p in hours}) == [M0, M0 + HOUR, M0 + 2 * HOUR]
    assert all(p.at >= rollup_cutoff(now) for p in after if p.span == MINUTE)
    assert len([p for p in after if p.span == MINUTE]) == len(recent)
    # Nothing more is due: a second call changes nothing.
    assert backend.rollup_history(keep_days=7, limit=10_000, now=now) == 0
    assert totals(backend.history(since=0, until=now + DAY)) == before


@pytest.mark.needs("history")
def test_rollup_is_bounded_per_call_and_totals_hold_between_calls(backend: Backend) -> None:
    now = float(M0 + 3 * DAY)
    backend.record_history([pt("a", M0 + i * MINUTE, processed=1) for i in range(30)])
    calls = []
    while True:
        n = backend.rollup_history(keep_days=7, limit=8, now=now)
        calls.append(n)
        assert totals(backend.history(since=0, until=now)) == {"a": (30, 0, 0, 0.0, 0.0)}
        if n < 8:
            break
    assert calls == [8, 8, 8, 6]
    assert [(p.at, p.span) for p in backend.history(since=0, until=now)] == [(M0, HOUR)]


@pytest.mark.needs("history")
def test_a_late_flush_into_a_rolled_hour_is_rolled_up_again(backend: Backend) -> None:
    now = float(M0 + 2 * DAY)
    backend.record_history([pt("a", M0, processed=1)])
    backend.rollup_history(keep_days=7, now=now)
    backend.record_history([pt("a", M0 + MINUTE, processed=2)])  # a worker back after a day
    assert totals(backend.history(since=0, until=now)) == {"a": (3, 0, 0, 0.0, 0.0)}
    backend.rollup_history(keep_days=7, now=now)
    assert [(p.at, p.span, p.processed) for p in backend.history(since=0, until=now)] == [
        (M0, HOUR, 3)]


@pytest.mark.needs("history")
def test_retention_deletes_hours_past_history_days(backend: Backend) -> None:
    now = float(M0 + 10 * DAY)
    backend.record_history([pt("a", M0 + d * int(DAY), processed=d + 1) for d in range(10)])
    backend.rollup_history(keep_days=7, limit=10_000, now=now)
    kept = backend.history(since=0, until=now)
    # The hours from more than 7 days before now are gone; days 3..9 (rolled or not) stay.
    assert sorted(p.processed for p in kept) == [4, 5, 6, 7, 8, 9, 10]
    assert all(p.at >= now - 7 * DAY for p in kept)


@pytest.mark.needs("history")
def test_the_retention_pass_rolls_up_under_the_prune_lock(backend: Backend) -> None:
    now = float(M0 + 9 * DAY)
    backend.record_history([pt("a", M0, processed=1), pt("a", int(now) - 2 * int(DAY),
                                                           processed=2)])
    pruner = Pruner(backend, [], history_days=7, pause=0.0)
    held = backend.try_lock(PRUNE_LOCK, ttl=30)
    assert held is not None
    try:
        assert asyncio.run(pruner.run(now=now)).skipped
        assert len(backend.history(since=0, until=now)) == 2
    finally:
        held.release()
    outcome = asyncio.run(pruner.run(now=now))
    # Both minutes rolled up, then the hour older than 7 days deleted.
    assert (outcome.deleted, outcome.more) == (3, False)
    assert [(p.span, p.processed) for p in backend.history(since=0, until=now)] == [(HOUR, 2)]


@pytest.fixture
def app(make_app: Callable[..., Conveyor]) -> Conveyor:
    return make_app(retry=RetryPolicy(base=0.01, cap=0.05))


@pytest.mark.needs("history")
def test_a_workers_outcomes_show_up_after_its_flush(app: Conveyor) -> None:
    attempts: Counter[int] = Counter()

    @app.task(name="ok", queue="hist")
    def ok() -> None:
        pass

    @app.task(name="flaky", queue="hist", max_attempts=2)
    def flaky(n: int) -> None:
        attempts[n] += 1
        raise Retry(delay=0.01, reason="again")

    backend = app.backend
    start = backend.now()
    with running_worker(app, queues="hist", history_interval=3600) as wt:
        w = wt.worker
        for _ in range(5):
            ok.enqueue()
        for n in range(3):
            flaky.enqueue(n)
        # 5 successes, then 3 failed attempts retried and 3 that went dead.
        wait_until(lambda: (w.counters.succeeded, w.counters.retried, w.counters.dead)
                   == (5, 3, 3), message="the worker counted every outcome")
        assert backend.history(queue="hist", since=start - HOUR, until=start + HOUR) == []
        assert w.flush_history() >= 1
        got = backend.history(queue="hist", since=start - HOUR, until=start + HOUR)
        assert totals(got)["hist"][:3] == (5, 3, 3)
        assert all(p.span == MINUTE and p.queue == "hist" for p in got)
        assert sum(p.run_sum for p in got) >= 0.0 and sum(p.wait_sum for p in got) >= 0.0
        assert w.flush_history() == 0  # nothing new: nothing written, nothing counted twice
        ok.enqueue()
        wait_until(lambda: w.counters.succeeded == 6, message="the sixth success")
    # Stopping flushed the last one.
    after = backend.history(queue="hist", since=start - HOUR, until=start + HOUR)
    assert totals(after)["hist"][:3] == (6, 3, 3)


@pytest.mark.needs("history")
def test_a_flush_the_store_refuses_goes_with_the_next(app: Conveyor,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    @app.task(name="ok", queue="hist")
    def ok() -> None:
        pass

    backend = app.backend
    start = backend.now()
    with running_worker(app, queues="hist", history_interval=3600) as wt:
        w = wt.worker
        ok.enqueue()
        wait_until(lambda: w.counters.succeeded == 1, message="the success")
        real = backend.record_history

        def refuse(points: list[HistoryPoint]) -> None:
            raise OSError("store away")

        monkeypatch.setattr(backend, "record_history", refuse)
        assert w.flush_history() == 0
        monkeypatch.setattr(backend, "record_history", real)
        assert w.flush_history() == 1
    got = backend.history(queue="hist", since=start - HOUR, until=start + HOUR)
    assert totals(got)["hist"][:3] == (1, 0, 0)


@pytest.mark.needs("clock")
def test_reap_names_the_queue_of_each_job_it_takes_back(backend: Backend) -> None:
    backend.enqueue_many([new_job(queue="q-a", max_attempts=1), new_job(queue="q-b")], now=T0)
    claimed = backend.claim("q-a", 1, worker_id="w", lease_s=5, now=T0)
    claimed += backend.claim("q-b", 1, worker_id="w", lease_s=5, now=T0)
    reaped = backend.reap(now=T0 + 10)
    assert len(reaped.dead) == 1 and len(reaped.requeued) == 1
    assert reaped.queues == {reaped.dead[0]: "q-a", reaped.requeued[0]: "q-b"}


@pytest.mark.needs("clock")
def test_a_job_the_reaper_made_dead_is_in_the_history(app: Conveyor) -> None:
    @app.task(name="doomed", queue="hist-reap", max_attempts=1)
    def doomed() -> None:
        pass

    backend = app.backend
    start = backend.now()
    doomed.enqueue()
    # A worker that died mid-job: claimed (started at once), never heartbeated again.
    [job] = backend.claim("hist-reap", 1, worker_id="gone", lease_s=0.2)
    with running_worker(app, queues="other", history_interval=3600) as wt:
        w = wt.worker
        wait_until(lambda: w.counters.reaped == 1, timeout=30, message="the reaper took it back")
        assert w.flush_history() >= 1
    got = backend.history(queue="hist-reap", since=start - HOUR, until=start + HOUR)
    assert totals(got)["hist-reap"][:3] == (0, 0, 1)
    assert app.get_job(job.id).state == "dead"
