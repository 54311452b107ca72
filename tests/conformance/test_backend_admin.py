"""Backend contract: deduplication, pruning, listing, stats, the dead-letter queue
(redrive/purge), cancel, waiting for work, and the store's clock."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import pytest
from support import T0, enqueue_one, new_job

from conveyor import JobState, LeaseLost
from conveyor.backends.base import Backend, ErrorInfo, Lease, QueueStats, WorkerInfo
from conveyor.job import Job

LEASE = 30.0


def snapshot(backend: Backend, job_id: int) -> Job:
    job = backend.get(job_id)
    assert job is not None
    return job


def lease_of(job: Job) -> Lease:
    assert job.lease_token is not None
    return Lease(job.id, job.lease_token)


def all_jobs(backend: Backend) -> list[Job]:
    page = backend.list_jobs(limit=10_000)
    assert page.next_cursor is None
    return page.jobs


def make_job_in(
    backend: Backend, state: JobState, *, now: float = T0, queue: str = "default", **kw: object
) -> int:
    """A job brought to ``state`` through the public transitions, all at time ``now``."""
    if state is JobState.SCHEDULED:
        return enqueue_one(backend, now=now, queue=queue, delay=1000.0, **kw)  # type: ignore[arg-type]
    job_id = enqueue_one(backend, now=now, queue=queue, **kw)  # type: ignore[arg-type]
    if state is JobState.AVAILABLE:
        return job_id
    if state is JobState.CANCELLED:
        assert backend.cancel(job_id, now=now)
        return job_id
    # Claim exactly this job: give it the best priority by claiming until we hold it.
    claimed = backend.claim(queue, 1000, worker_id="maker", lease_s=LEASE, now=now)
    mine = [j for j in claimed if j.id == job_id]
    others = [j for j in claimed if j.id != job_id]
    backend.release([lease_of(j) for j in others], now=now)
    [job] = mine
    if state is JobState.SUCCEEDED:
        backend.ack(lease_of(job), json.dumps("ok"), now=now)
    elif state is JobState.DEAD:
        backend.kill(lease_of(job), ErrorInfo("rejected", "made dead for the test"), now=now)
    else:
        assert state is JobState.RUNNING
    assert snapshot(backend, job_id).state is state
    return job_id


# -- unique_key -------------------------------------------------------------------------------


@pytest.mark.needs("unique")
def test_unique_key_returns_the_unfinished_job(backend: Backend) -> None:
    [first] = backend.enqueue_many([new_job(args={"n": 1}, unique_key="welcome:42")], now=T0)
    assert first.created
    [second] = backend.enqueue_many([new_job(args={"n": 2}, unique_key="welcome:42")], now=T0 + 1)
    assert second.id == first.id
    assert second.created is False
    assert len(all_jobs(backend)) == 1
    assert snapshot(backend, first.id).args == {"n": 1}

    # Still unfinished while running.
    [job] = backend.claim("default", 1, worker_id="w", lease_s=LEASE, now=T0 + 2)
    [third] = backend.enqueue_many([new_job(unique_key="welcome:42")], now=T0 + 3)
    assert (third.id, third.created) == (first.id, False)

    # Once finished, the key is free again.
    backend.ack(lease_of(job), None, now=T0 + 4)
    [fourth] = backend.enqueue_many([new_job(unique_key="welcome:42")], now=T0 + 5)
    assert fourth.created
    assert fourth.id != first.id
    assert len(all_jobs(backend)) == 2


@pytest.mark.needs("unique")
def test_unique_key_is_held_while_scheduled_and_freed_by_cancel_or_death(backend: Backend) -> None:
    [a] = backend.enqueue_many([new_job(unique_key="k", delay=100)], now=T0)
    [b] = backend.enqueue_many([new_job(unique_key="k")], now=T0 + 1)
    assert (b.id, b.created) == (a.id, False)
    assert backend.cancel(a.id, now=T0 + 2)
    [c] = backend.enqueue_many([new_job(unique_key="k", max_attempts=1)], now=T0 + 3)
    assert c.created and c.id != a.id

    [job] = backend.claim("default", 1, worker_id="w", lease_s=LEASE, now=T0 + 4)
    assert job.id == c.id
    backend.kill(lease_of(job), ErrorInfo("rejected", "no"), now=T0 + 5)
    [d] = backend.enqueue_many([new_job(unique_key="k")], now=T0 + 6)
    assert d.created and d.id not in (a.id, c.id)


@pytest.mark.needs("unique")
def test_unique_key_repeated_inside_one_batch(backend: Backend) -> None:
    results = backend.enqueue_many(
        [
            new_job(unique_key="same", args={"n": 0}),
            new_job(args={"n": 1}),
            new_job(unique_key="same", args={"n": 2}),
        ],
        now=T0,
    )
    assert [r.created for r in results] == [True, True, False]
    assert results[2].id == results[0].id
    assert results[1].id != results[0].id
    assert len(all_jobs(backend)) == 2


@pytest.mark.needs("unique")
def test_different_unique_keys_do_not_collide(backend: Backend) -> None:
    results = backend.enqueue_many([new_job(unique_key="a"), new_job(unique_key="b")], now=T0)
    assert all(r.created for r in results)
    assert results[0].id != results[1].id


# -- prune --------------------------------------------------------------------------------------


@pytest.mark.needs("lookup")
def test_prune_deletes_only_old_finished_jobs_of_the_given_states(backend: Backend) -> None:
    old_ok = make_job_in(backend, JobState.SUCCEEDED, now=T0 + 10)
    new_ok = make_job_in(backend, JobState.SUCCEEDED, now=T0 + 100)
    old_dead = make_job_in(backend, JobState.DEAD, now=T0 + 10)
    old_cancelled = make_job_in(backend, JobState.CANCELLED, now=T0 + 10)
    assert snapshot(backend, old_cancelled).finished_at == T0 + 10
    waiting = make_job_in(backend, JobState.AVAILABLE, now=T0)
    running = make_job_in(backend, JobState.RUNNING, now=T0 + 10)
    scheduled = make_job_in(backend, JobState.SCHEDULED, now=T0)

    # Finished more than 50s before T0+110 means finished before T0+60.
    assert backend.prune(older_than=50, now=T0 + 110) == 1  # default: succeeded only
    assert backend.get(old_ok) is None
    assert backend.get(new_ok) is not None
    assert backend.get(old_dead) is not None

    assert (
        backend.prune(older_than=50, states=(JobState.DEAD, JobState.CANCELLED), now=T0 + 110) == 2
    )
    remaining = {j.id for j in all_jobs(backend)}
    assert remaining == {new_ok, waiting, running, scheduled}
    assert backend.get(old_cancelled) is None


@pytest.mark.needs("lookup")
def test_prune_is_bounded_by_limit(backend: Backend) -> None:
    ids = [make_job_in(backend, JobState.SUCCEEDED, now=T0 + i) for i in range(5)]
    assert backend.prune(older_than=10, limit=2, now=T0 + 100) == 2
    assert len(all_jobs(backend)) == 3
    assert backend.prune(older_than=10, limit=2, now=T0 + 100) == 2
    assert backend.prune(older_than=10, limit=2, now=T0 + 100) == 1
    assert backend.prune(older_than=10, limit=2, now=T0 + 100) == 0
    assert all(backend.get(i) is None for i in ids)


@pytest.mark.needs("lookup")
def test_prune_refuses_unfinished_states(backend: Backend) -> None:
    job_id = make_job_in(backend, JobState.AVAILABLE)
    with pytest.raises(ValueError):
        backend.prune(older_than=0, states=(JobState.AVAILABLE,), now=T0 + 1000)
    assert snapshot(backend, job_id).state is JobState.AVAILABLE


# -- list_jobs ----------------------------------------------------------------------------------


@pytest.mark.needs("listing")
def test_list_jobs_pages_newest_first_without_gaps_or_duplicates(backend: Backend) -> None:
    ids = [enqueue_one(backend, args={"n": i}) for i in range(23)]
    seen: list[int] = []
    cursor = None
    pages = 0
    while True:
        page = backend.list_jobs(cursor=cursor, limit=5)
        pages += 1
        assert len(page.jobs) <= 5
        seen.extend(j.id for j in page.jobs)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert pages == 5
    assert seen == sorted(ids, reverse=True)


@pytest.mark.needs("listing")
def test_list_jobs_last_full_page_has_no_next_cursor(backend: Backend) -> None:
    ids = [enqueue_one(backend) for _ in range(10)]
    first = backend.list_jobs(limit=5)
    assert [j.id for j in first.jobs] == sorted(ids, reverse=True)[:5]
    assert first.next_cursor is not None
    second = backend.list_jobs(cursor=first.next_cursor, limit=5)
    assert [j.id for j in second.jobs] == sorted(ids, reverse=True)[5:]
    assert second.next_cursor is None


@pytest.mark.needs("lookup")
def test_list_jobs_filters_by_state_queue_and_task_with_pagination(backend: Backend) -> None:
    expected: dict[tuple[str, str, JobState], list[int]] = {}
    for i in range(24):
        queue = "a" if i % 2 else "b"
        task = "t.one" if i % 3 else "t.two"
        state = JobState.DEAD if i % 4 == 0 else JobState.AVAILABLE
        job_id = make_job_in(backend, state, queue=queue, task=task)
        expected.setdefault((queue, task, state), []).append(job_id)

    def collect(**filters: object) -> list[int]:
        out: list[int] = []
        cursor = None
        while True:
            page = backend.list_jobs(cursor=cursor, limit=3, **filters)  # type: ignore[arg-type]
            for j in page.jobs:
                for key, value in filters.items():
                    assert getattr(j, key) == value
            out.extend(j.id for j in page.jobs)
            if page.next_cursor is None:
                return out
            cursor = page.next_cursor

    def want(
        queue: str | None = None, task: str | None = None, state: JobState | None = None
    ) -> list[int]:
        return sorted(
            (
                i
                for (q, t, s), ids in expected.items()
                for i in ids
                if queue in (None, q) and task in (None, t) and state in (None, s)
            ),
            reverse=True,
        )

    assert collect(queue="a") == want(queue="a")
    assert collect(task="t.two") == want(task="t.two")
    assert collect(state=JobState.DEAD) == want(state=JobState.DEAD)
    assert collect(queue="b", state=JobState.AVAILABLE, task="t.one") == want(
        "b", "t.one", JobState.AVAILABLE
    )
    assert len(collect()) == 24
    assert backend.list_jobs(queue="nope").jobs == []
    assert backend.list_jobs(queue="nope").next_cursor is None


# -- stats --------------------------------------------------------------------------------------


def queue_stats(backend: Backend, now: float, name: str) -> QueueStats:
    by_name = {q.queue: q for q in backend.stats(now=now).queues}
    assert name in by_name, f"no stats for queue {name!r}: {sorted(by_name)}"
    return by_name[name]


@pytest.mark.needs("lookup")
def test_stats_counts_by_state_per_queue_and_oldest_waiting_age(backend: Backend) -> None:
    make_job_in(backend, JobState.RUNNING, queue="a", now=T0)
    make_job_in(backend, JobState.SUCCEEDED, queue="a", now=T0)
    make_job_in(backend, JobState.DEAD, queue="a", now=T0)
    make_job_in(backend, JobState.CANCELLED, queue="a", now=T0)
    enqueue_one(backend, queue="a", delay=5, now=T0)  # due at T0+5: waiting from then on
    enqueue_one(backend, queue="a", delay=1000, now=T0)  # not due
    enqueue_one(backend, queue="a", now=T0 + 1)
    enqueue_one(backend, queue="a", now=T0 + 2)
    enqueue_one(backend, queue="b", now=T0 + 20)
    make_job_in(backend, JobState.SUCCEEDED, queue="c", now=T0)
    enqueue_one(backend, queue="d", delay=5, now=T0)  # due at T0+5, older than d's available job
    enqueue_one(backend, queue="d", now=T0 + 10)

    stats = backend.stats(now=T0 + 50)
    assert stats.now == T0 + 50
    by = {q.queue: q for q in stats.queues}
    assert set(by) == {"a", "b", "c", "d"}

    a = by["a"]
    assert (a.scheduled, a.available, a.running, a.succeeded, a.dead, a.cancelled) == (
        1,
        3,
        1,
        1,
        1,
        1,
    )
    assert a.depth == 3
    assert a.oldest_available_age == pytest.approx(49.0)  # the job enqueued at T0+1

    b = by["b"]
    assert (b.scheduled, b.available, b.running, b.succeeded, b.dead, b.cancelled) == (
        0,
        1,
        0,
        0,
        0,
        0,
    )
    assert b.oldest_available_age == pytest.approx(30.0)

    d = by["d"]
    assert (d.scheduled, d.available) == (0, 2)
    assert d.oldest_available_age == pytest.approx(45.0)  # the due scheduled job counts as waiting

    c = by["c"]
    assert (c.available, c.succeeded) == (0, 1)
    assert c.oldest_available_age is None

    # Earlier, the delayed job is not due yet: it is scheduled, and the oldest waiting one is T0+1's.
    a_early = queue_stats(backend, T0 + 3, "a")
    assert (a_early.scheduled, a_early.available) == (2, 2)
    assert a_early.oldest_available_age == pytest.approx(2.0)


@pytest.mark.needs("workers")
def test_stats_lists_workers_seen_within_ttl(backend: Backend) -> None:
    def info(worker_id: str, running: int = 0) -> WorkerInfo:
        return WorkerInfo(
            id=worker_id,
            queues=["high", "default"],
            concurrency=8,
            host="h1",
            pid=1234,
            started_at=T0,
            last_seen=0.0,
            running=running,
        )

    backend.record_worker(info("fresh", running=3), now=T0 + 100)
    backend.record_worker(info("stale"), now=T0 + 10)

    workers = backend.stats(now=T0 + 105, worker_ttl=60).workers
    assert [w.id for w in workers] == ["fresh"]
    [w] = workers
    assert (w.queues, w.concurrency, w.host, w.pid, w.started_at, w.last_seen, w.running) == (
        ["high", "default"],
        8,
        "h1",
        1234,
        T0,
        T0 + 100,
        3,
    )

    backend.record_worker(info("stale", running=1), now=T0 + 104)  # heartbeat brings it back
    assert {w.id for w in backend.stats(now=T0 + 105, worker_ttl=60).workers} == {"fresh", "stale"}
    backend.remove_worker("fresh")
    assert [w.id for w in backend.stats(now=T0 + 105, worker_ttl=60).workers] == ["stale"]


# -- dead-letter queue: redrive and purge ---------------------------------------------------------


@pytest.mark.needs("lookup")
def test_redrive_by_ids_by_queue_and_all(backend: Backend) -> None:
    d1 = make_job_in(backend, JobState.DEAD, queue="a", max_attempts=2)
    d2 = make_job_in(backend, JobState.DEAD, queue="a")
    d3 = make_job_in(backend, JobState.DEAD, queue="b")
    others = {
        make_job_in(backend, s, queue="a")
        for s in (
            JobState.AVAILABLE,
            JobState.SUCCEEDED,
            JobState.RUNNING,
            JobState.SCHEDULED,
            JobState.CANCELLED,
        )
    }
    before = {i: snapshot(backend, i) for i in others}

    assert backend.redrive([d1, *others], now=T0 + 50) == 1
    job = snapshot(backend, d1)
    assert job.state is JobState.AVAILABLE
    assert job.attempts == 0
    assert job.finished_at is None
    assert job.run_at == T0 + 50
    assert job.max_attempts == 2
    assert {i: snapshot(backend, i) for i in others} == before

    assert backend.redrive(queue="b", now=T0 + 51) == 1
    assert snapshot(backend, d3).state is JobState.AVAILABLE
    assert snapshot(backend, d2).state is JobState.DEAD

    assert backend.redrive(now=T0 + 52) == 1
    assert snapshot(backend, d2).state is JobState.AVAILABLE
    assert backend.redrive(now=T0 + 53) == 0
    assert {i: snapshot(backend, i) for i in others} == before

    # A redriven job runs again with a full set of attempts.
    claimed = backend.claim("a", 10, worker_id="w", lease_s=LEASE, now=T0 + 60)
    assert {j.id for j in claimed} >= {d1, d2}
    assert all(j.attempts == 1 for j in claimed if j.id in (d1, d2))


@pytest.mark.needs("unique")
def test_redrive_respects_a_unique_key_taken_meanwhile(backend: Backend) -> None:
    """A dead job's unique key may be reused by a new job; redriving the dead one must not
    create a second unfinished job with that key, nor make the redrive of others fail."""
    dead_keyed = make_job_in(backend, JobState.DEAD, unique_key="report:7")
    [live] = backend.enqueue_many([new_job(unique_key="report:7")], now=T0 + 1)
    assert live.created
    other_dead = make_job_in(backend, JobState.DEAD)

    redriven = backend.redrive(now=T0 + 2)

    unfinished_with_key = [
        j for j in all_jobs(backend) if j.unique_key == "report:7" and not j.is_final
    ]
    assert [j.id for j in unfinished_with_key] == [live.id]
    assert snapshot(backend, other_dead).state is JobState.AVAILABLE
    assert redriven == 1 + (snapshot(backend, dead_keyed).state is JobState.AVAILABLE)


@pytest.mark.needs("lookup")
def test_purge_deletes_only_finished_jobs_of_the_given_state(backend: Backend) -> None:
    d1 = make_job_in(backend, JobState.DEAD, queue="a")
    d2 = make_job_in(backend, JobState.DEAD, queue="a")
    d3 = make_job_in(backend, JobState.DEAD, queue="b")
    d4 = make_job_in(backend, JobState.DEAD, queue="b")
    ok = make_job_in(backend, JobState.SUCCEEDED, queue="a")
    waiting = make_job_in(backend, JobState.AVAILABLE, queue="b")

    assert backend.purge(state=JobState.DEAD, queue="a") == 2
    assert backend.get(d1) is None and backend.get(d2) is None
    assert backend.purge(state=JobState.DEAD, job_ids=[d3, waiting, ok]) == 1
    assert backend.get(d3) is None
    assert backend.get(waiting) is not None and backend.get(ok) is not None
    assert backend.purge(state=JobState.SUCCEEDED) == 1
    assert backend.get(ok) is None
    assert backend.purge() == 1  # default: dead
    assert backend.get(d4) is None
    assert [j.id for j in all_jobs(backend)] == [waiting]


@pytest.mark.parametrize("state", [JobState.AVAILABLE, JobState.SCHEDULED, JobState.RUNNING])
@pytest.mark.needs("lookup")
def test_purge_refuses_unfinished_states(backend: Backend, state: JobState) -> None:
    job_id = make_job_in(backend, state)
    before = snapshot(backend, job_id)
    with pytest.raises(ValueError):
        backend.purge(state=state)
    with pytest.raises(ValueError):
        backend.purge(state=state, job_ids=[job_id])
    assert snapshot(backend, job_id) == before


# -- cancel ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("state", [JobState.AVAILABLE, JobState.SCHEDULED])
@pytest.mark.needs("cancel")
def test_cancel_a_waiting_job(backend: Backend, state: JobState) -> None:
    job_id = make_job_in(backend, state)
    assert backend.cancel(job_id, now=T0 + 5) is True
    job = snapshot(backend, job_id)
    assert job.state is JobState.CANCELLED
    assert job.finished_at == T0 + 5
    assert backend.claim("default", 10, worker_id="w", lease_s=LEASE, now=T0 + 5000) == []


@pytest.mark.needs("cancel")
def test_cancel_a_running_job_takes_its_lease_away(backend: Backend) -> None:
    enqueue_one(backend)
    [job] = backend.claim("default", 1, worker_id="w", lease_s=LEASE, now=T0)
    assert backend.cancel(job.id, now=T0 + 1) is True

    after = snapshot(backend, job.id)
    assert after.state is JobState.CANCELLED
    assert after.finished_at == T0 + 1
    assert after.lease_token is None
    assert backend.heartbeat([lease_of(job)], lease_s=LEASE, now=T0 + 2) == {job.id}
    with pytest.raises(LeaseLost):
        backend.ack(lease_of(job), json.dumps("too late"), now=T0 + 2)
    with pytest.raises(LeaseLost):
        backend.retry(lease_of(job), ErrorInfo("exception", "x"), delay=0, now=T0 + 2)
    assert backend.release([lease_of(job)], now=T0 + 2) == []
    assert snapshot(backend, job.id) == after
    assert backend.reap(now=T0 + 1000).count == 0


@pytest.mark.parametrize("state", [JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED])
@pytest.mark.needs("cancel", "lookup")
def test_cancel_of_a_finished_job_returns_false(backend: Backend, state: JobState) -> None:
    job_id = make_job_in(backend, state)
    before = snapshot(backend, job_id)
    assert backend.cancel(job_id, now=T0 + 9) is False
    assert snapshot(backend, job_id) == before


@pytest.mark.needs("cancel")
def test_cancel_of_a_missing_job_returns_false(backend: Backend) -> None:
    job_id = enqueue_one(backend)
    assert backend.cancel(job_id + 1000, now=T0) is False
    assert snapshot(backend, job_id).state is JobState.AVAILABLE


# -- waiting for work -------------------------------------------------------------------------------


def _wait_in_thread(
    backend: Backend, queues: list[str], timeout: float
) -> tuple[threading.Thread, dict]:
    out: dict = {}
    started = threading.Event()

    def run() -> None:
        started.set()
        t = time.monotonic()
        out["result"] = backend.wait_for_jobs(queues, timeout)
        out["elapsed"] = time.monotonic() - t

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(5)
    return thread, out


def test_wait_for_jobs_wakes_on_an_enqueue_from_another_thread(backend: Backend) -> None:
    thread, out = _wait_in_thread(backend, ["default"], timeout=10)
    backend.enqueue_many([new_job()])
    thread.join(10)
    assert out["result"] is True
    assert out["elapsed"] < 5  # woken, not timed out


def test_wait_for_jobs_wakes_on_an_enqueue_through_another_connection(
    backend: Backend, open_store: Callable[[], Backend]
) -> None:
    other = open_store()
    thread, out = _wait_in_thread(backend, ["default"], timeout=10)
    other.enqueue_many([new_job()])
    thread.join(10)
    assert out["result"] is True
    assert out["elapsed"] < 5


def test_wait_for_jobs_times_out_when_nothing_comes(backend: Backend) -> None:
    enqueue_one(backend, queue="elsewhere", now=time.time())  # waiting, but not on our queue
    t = time.monotonic()
    assert backend.wait_for_jobs(["default"], 0.2) is False
    assert time.monotonic() - t >= 0.19


def test_wait_for_jobs_returns_at_once_if_work_is_waiting(backend: Backend) -> None:
    enqueue_one(backend, now=time.time())
    t = time.monotonic()
    assert backend.wait_for_jobs(["default"], 10) is True
    assert time.monotonic() - t < 5


# -- the store's clock ----------------------------------------------------------------------------


@pytest.mark.needs("lookup")
def test_time_comes_from_the_store(backend: Backend) -> None:
    assert abs(backend.now() - time.time()) < 5
    [res] = backend.enqueue_many([new_job()])
    job = snapshot(backend, res.id)
    assert abs(job.created_at - backend.now()) < 5
    assert job.created_at == res.at
    [claimed] = backend.claim("default", 1, worker_id="w", lease_s=LEASE)
    assert claimed.attempted_at is not None and claimed.lease_expires_at is not None
    assert claimed.lease_expires_at == pytest.approx(claimed.attempted_at + LEASE)
    assert abs(claimed.attempted_at - backend.now()) < 5


@pytest.mark.needs("cancel")
def test_stats_without_finished_history_keeps_every_other_number(backend: Backend) -> None:
    """The scrape-time form: succeeded/cancelled are left out, the rest is identical."""
    ids = [enqueue_one(backend, now=T0, max_attempts=1) for _ in range(4)]
    enqueue_one(backend, now=T0, delay=100)
    a, b, c = backend.claim("default", 3, worker_id="w", lease_s=60, now=T0 + 1)
    backend.ack(Lease(a.id, a.lease_token or ""), None, now=T0 + 2)
    backend.kill(Lease(b.id, b.lease_token or ""), ErrorInfo(kind="rejected", message="x"), now=T0 + 2)
    # A broker hands out in lane order, not by id: cancel whichever of the four it left.
    [left] = [i for i in ids if i not in {a.id, b.id, c.id}]
    assert backend.cancel(left, now=T0 + 2)
    full = {q.queue: q for q in backend.stats(now=T0 + 3).queues}["default"]
    lean = {q.queue: q for q in backend.stats(now=T0 + 3, finished=False).queues}["default"]
    assert (full.succeeded, full.cancelled) == (1, 1)
    assert (lean.succeeded, lean.cancelled) == (0, 0)
    for field in ("scheduled", "available", "running", "dead", "lease_expiries", "oldest_available_age"):
        assert getattr(lean, field) == getattr(full, field), field
    assert (lean.running, lean.dead, lean.scheduled) == (1, 1, 1) and c.id in ids
