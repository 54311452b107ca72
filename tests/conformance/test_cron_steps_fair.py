"""Store-level contract of cron ticks, exactly-once step records, the unique window after
success, and fair sharing by fair_key: the same on every backend."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import replace

import pytest
from support import T0, enqueue_one, new_job

from conveyor import QueueFull
from conveyor.backends.base import Backend, EnqueueResult, Lease
from conveyor.errors import JobNotFound
from conveyor.job import Job, JobState


def _claim_one(backend: Backend, now: float = T0, queue: str = "default") -> Job:
    [job] = backend.claim(queue, 1, worker_id="w", lease_s=30, now=now)
    return job


def _lease(job: Job) -> Lease:
    assert job.lease_token is not None
    return Lease(job.id, job.lease_token)


def _enqueue_with_uid(backend: Backend) -> tuple[int, str | None]:
    [made] = backend.enqueue_many([new_job()], now=T0)
    return made.id, made.uid


def _race(n: int, fn: Callable[[int], object]) -> list[object]:
    """Run fn(i) on n threads released together; return their results (or exceptions)."""
    barrier = threading.Barrier(n)
    out: list[object] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            out[i] = fn(i)
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


# -- cron ticks ---------------------------------------------------------------------------------

@pytest.mark.needs("cron")
def test_a_new_schedule_records_its_first_tick_without_a_job(backend: Backend) -> None:
    assert backend.cron_ticks() == {}
    assert backend.cron_enqueue("nightly", T0, None, now=T0) is None
    assert backend.cron_ticks() == {"nightly": T0}
    assert backend.stats(now=T0).queues == []


@pytest.mark.needs("cron")
def test_each_tick_is_enqueued_once_and_never_an_older_one(backend: Backend) -> None:
    job = replace(new_job(), unique_key="cron:nightly:1", meta=json.dumps({"cron": {"tick": T0 + 60}}))
    first = backend.cron_enqueue("nightly", T0 + 60, job, now=T0 + 61)
    assert isinstance(first, EnqueueResult) and first.created
    assert backend.cron_enqueue("nightly", T0 + 60, job, now=T0 + 62) is None
    assert backend.cron_enqueue("nightly", T0, job, now=T0 + 62) is None
    assert backend.cron_ticks() == {"nightly": T0 + 60}
    stored = backend.get(first.id)
    assert stored is not None and stored.meta["cron"]["tick"] == T0 + 60
    assert stored.state is JobState.AVAILABLE
    later = backend.cron_enqueue("nightly", T0 + 120, replace(job, unique_key="cron:nightly:2"), now=T0 + 121)
    assert later is not None and later.created and later.id != first.id
    assert backend.cron_ticks() == {"nightly": T0 + 120}


@pytest.mark.needs("cron")
def test_schedules_are_independent(backend: Backend) -> None:
    assert backend.cron_enqueue("a", T0, new_job(), now=T0) is not None
    assert backend.cron_enqueue("b", T0, new_job(), now=T0) is not None
    assert backend.cron_ticks() == {"a": T0, "b": T0}


@pytest.mark.needs("cron")
def test_racing_schedulers_enqueue_a_tick_once(backend: Backend) -> None:
    results = _race(8, lambda i: backend.cron_enqueue("every-minute", T0 + 60, new_job(), now=T0 + 60))
    assert not [r for r in results if isinstance(r, Exception)], results
    created = [r for r in results if isinstance(r, EnqueueResult)]
    assert len(created) == 1
    assert sum(q.available for q in backend.stats(now=T0 + 60).queues) == 1


@pytest.mark.needs("cron")
def test_a_full_queue_leaves_the_tick_untaken(backend: Backend) -> None:
    full = replace(new_job(), max_depth=1)
    backend.enqueue_many([full], now=T0)
    with pytest.raises(QueueFull):
        backend.cron_enqueue("c", T0 + 60, full, now=T0 + 60)
    assert "c" not in backend.cron_ticks()
    assert sum(q.available for q in backend.stats(now=T0 + 60).queues) == 1


# -- exactly-once step records ------------------------------------------------------------------

@pytest.mark.needs("steps")
def test_the_first_step_record_wins_and_shows_on_the_job(backend: Backend) -> None:
    job_id, uid = _enqueue_with_uid(backend)
    assert backend.record_step(job_id, "charge-card", json.dumps({"charge": "ch_1"}), uid=uid) == (
        True, json.dumps({"charge": "ch_1"}))
    created, stored = backend.record_step(job_id, "charge-card", json.dumps({"charge": "ch_2"}), uid=uid)
    assert not created and json.loads(stored or "null") == {"charge": "ch_1"}
    assert backend.record_step(job_id, "email", None, uid=uid) == (True, None)
    job = backend.get(job_id)
    assert job is not None and job.steps == {"charge-card": {"charge": "ch_1"}, "email": None}


@pytest.mark.needs("steps")
def test_step_records_survive_retries_and_redelivery(backend: Backend) -> None:
    from conveyor.backends.base import ErrorInfo

    job_id, uid = _enqueue_with_uid(backend)
    job = _claim_one(backend)
    backend.record_step(job_id, "s1", "1", uid=uid)
    backend.retry(_lease(job), ErrorInfo("exception", "boom"), delay=0, now=T0 + 1)
    again = _claim_one(backend, now=T0 + 2)
    assert again.id == job_id and again.steps == {"s1": 1}
    assert backend.record_step(job_id, "s1", "2", uid=uid) == (False, "1")


@pytest.mark.needs("steps")
def test_a_step_of_an_unknown_job_is_refused(backend: Backend) -> None:
    with pytest.raises(JobNotFound):
        backend.record_step(999_999, "s", None, uid=None)


@pytest.mark.needs("steps")
def test_racing_attempts_record_a_step_once(backend: Backend) -> None:
    job_id, uid = _enqueue_with_uid(backend)
    results = _race(8, lambda i: backend.record_step(job_id, "pay", str(i), uid=uid))
    assert not [r for r in results if isinstance(r, Exception)], results
    wins = [r for r in results if isinstance(r, tuple) and r[0]]
    assert len(wins) == 1
    winner = wins[0][1]
    assert all(isinstance(r, tuple) and r[1] == winner for r in results)


# -- the unique window after success -------------------------------------------------------------

def _run_to_success(backend: Backend, job_id: int, at: float) -> None:
    job = _claim_one(backend, now=at)
    assert job.id == job_id
    backend.ack(_lease(job), None, now=at)


@pytest.mark.needs("unique")
def test_unique_for_keeps_a_succeeded_job_answering_for_its_key(backend: Backend) -> None:
    job = replace(new_job(), unique_key="report:7", unique_for=60.0)
    [first] = backend.enqueue_many([job], now=T0)
    _run_to_success(backend, first.id, T0 + 1)
    [inside] = backend.enqueue_many([job], now=T0 + 30)
    assert (inside.id, inside.created) == (first.id, False)
    [after] = backend.enqueue_many([job], now=T0 + 62)
    assert after.created and after.id != first.id


@pytest.mark.needs("unique")
def test_without_unique_for_the_key_is_free_once_the_job_finishes(backend: Backend) -> None:
    job = replace(new_job(), unique_key="k")
    [first] = backend.enqueue_many([job], now=T0)
    _run_to_success(backend, first.id, T0 + 1)
    [second] = backend.enqueue_many([job], now=T0 + 2)
    assert second.created and second.id != first.id


@pytest.mark.needs("unique")
def test_a_dead_job_frees_its_key_even_with_unique_for(backend: Backend) -> None:
    from conveyor.backends.base import ErrorInfo

    job = replace(new_job(), unique_key="k", unique_for=600.0)
    [first] = backend.enqueue_many([job], now=T0)
    claimed = _claim_one(backend, now=T0 + 1)
    backend.kill(_lease(claimed), ErrorInfo("rejected", "no"), now=T0 + 1)
    [second] = backend.enqueue_many([job], now=T0 + 2)
    assert second.created and second.id != first.id


# -- fair sharing -------------------------------------------------------------------------------

def _claim_order(backend: Backend, n: int, batch: int = 1, now: float = T0) -> list[Job]:
    order: list[Job] = []
    while len(order) < n:
        got = backend.claim("default", batch, worker_id="w", lease_s=300, now=now)
        if not got:
            break
        order.extend(got)
    return order


@pytest.mark.needs("fair")
def test_a_small_tenant_is_not_starved_by_a_big_backlog(backend: Backend) -> None:
    big = replace(new_job(args={"t": "A"}), fair_key="tenant-A")
    backend.enqueue_many([big] * 2000, now=T0)
    _claim_order(backend, 10)  # the queue is busy with tenant A
    small = replace(new_job(args={"t": "B"}), fair_key="tenant-B")
    backend.enqueue_many([small] * 20, now=T0)
    order = _claim_order(backend, 60, batch=8)
    tenants = [j.fair_key for j in order]
    last_b = max(i for i, t in enumerate(tenants) if t == "tenant-B")
    assert tenants.count("tenant-B") == 20 and last_b < 45, tenants
    # And they alternate rather than B taking over: A keeps its share meanwhile.
    assert tenants[:40].count("tenant-A") >= 18


@pytest.mark.needs("fair")
def test_three_tenants_rotate(backend: Backend) -> None:
    for key in ("a", "b", "c"):
        backend.enqueue_many([replace(new_job(), fair_key=key)] * 30, now=T0)
    order = [j.fair_key for j in _claim_order(backend, 30, batch=4)]
    for i in range(0, 30, 3):
        assert sorted(order[i:i + 3]) == ["a", "b", "c"], order


@pytest.mark.needs("fair")
def test_priority_still_comes_before_fairness(backend: Backend) -> None:
    backend.enqueue_many([replace(new_job(), fair_key="a")] * 5, now=T0)
    urgent = enqueue_one(backend, priority=-1, fair_key="a")
    assert _claim_one(backend).id == urgent


@pytest.mark.needs("fair")
def test_jobs_without_a_fair_key_join_the_current_round(backend: Backend) -> None:
    backend.enqueue_many([replace(new_job(), fair_key="a")] * 50, now=T0)
    _claim_order(backend, 5)
    plain = enqueue_one(backend)
    order = [j.id for j in _claim_order(backend, 4)]
    assert plain in order


@pytest.mark.needs("ordering")  # a broker's lane is only roughly first in, first out
def test_plain_jobs_stay_first_in_first_out(backend: Backend) -> None:
    first = [enqueue_one(backend) for _ in range(3)]
    assert _claim_one(backend).id == first[0]
    later = [enqueue_one(backend) for _ in range(3)]
    assert [j.id for j in _claim_order(backend, 5, batch=2)] == first[1:] + later


@pytest.mark.needs("fair")
def test_a_retried_job_keeps_its_place_in_the_rotation(backend: Backend) -> None:
    from conveyor.backends.base import ErrorInfo

    backend.enqueue_many([replace(new_job(), fair_key="a")] * 3, now=T0)
    job = _claim_one(backend)
    backend.retry(_lease(job), ErrorInfo("exception", "x"), delay=0, now=T0)
    assert _claim_one(backend).id == job.id
    stored = backend.get(job.id)
    assert stored is not None and stored.fair_key == "a"


@pytest.mark.needs("fair")
def test_an_urgent_job_of_a_busy_tenant_does_not_move_the_others_round(backend: Backend) -> None:
    backend.enqueue_many([replace(new_job(), fair_key="A")] * 100, now=T0)
    urgent = enqueue_one(backend, fair_key="A", priority=-1)
    assert _claim_one(backend).id == urgent
    backend.enqueue_many([replace(new_job(), fair_key="B")] * 5, now=T0)
    tenants = [j.fair_key for j in _claim_order(backend, 10, batch=2)]
    assert tenants.count("B") == 5, tenants


@pytest.mark.needs("fair")
def test_a_redriven_job_joins_the_current_round(backend: Backend) -> None:
    from conveyor.backends.base import ErrorInfo

    dead_id = enqueue_one(backend, fair_key="A")
    job = _claim_one(backend)
    backend.kill(_lease(job), ErrorInfo("rejected", "x"), now=T0)
    backend.enqueue_many([new_job()] * 20, now=T0)
    _claim_order(backend, 10, batch=5)
    assert backend.redrive([dead_id], now=T0) == 1
    assert _claim_one(backend).id != dead_id  # it does not jump the jobs already waiting
    order = [j.id for j in _claim_order(backend, 20, batch=5)]
    assert dead_id in order
