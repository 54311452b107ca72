"""Backend contract for ``cancel_many``: many jobs cancelled in one atomic write, each as
``cancel`` would (a running job loses its lease, a cancelled parent's waiting children are
cancelled in turn, unique keys are freed, job.wait is woken), finished and unknown ids skipped;
and bulk cancel, which writes each batch with one ``cancel_many``."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from support import T0, enqueue_one, new_job

from conveyor import JobState, LeaseLost
from conveyor.backends.base import Backend, ErrorInfo, Lease
from conveyor.bulk import BulkAction, JobFilter, run_batch
from conveyor.job import Job

LEASE = 30.0
UNKNOWN = 987_654_321


def get(backend: Backend, job_id: int) -> Job:
    job = backend.get(job_id)
    assert job is not None
    return job


def claim(backend: Backend, queue: str, job_id: int, now: float = T0) -> Lease:
    """Claim exactly this job (others claimed on the way are released)."""
    claimed = backend.claim(queue, 1000, worker_id="w", lease_s=LEASE, now=now)
    backend.release([Lease(j.id, j.lease_token or "") for j in claimed if j.id != job_id],
                    now=now)
    [job] = [j for j in claimed if j.id == job_id]
    return Lease(job.id, job.lease_token or "")


def own(backend: Backend) -> Callable[..., list[int]]:
    return backend.cancel_many


def default(backend: Backend) -> Callable[..., list[int]]:
    """The base class's version (one ``cancel`` per id), as a third-party store has it."""
    return lambda ids, **kw: Backend.cancel_many(backend, ids, **kw)


@pytest.mark.parametrize("version", [own, default], ids=["own", "default"])
@pytest.mark.needs("dependencies", "unique")
@pytest.mark.needs("cross_queue")
def test_cancel_many_cancels_unfinished_jobs_and_skips_the_rest(
        backend: Backend, version: Callable[[Backend], Callable[..., list[int]]]) -> None:
    available = enqueue_one(backend, now=T0, unique_key="u-1")
    scheduled = enqueue_one(backend, now=T0, queue="q2", delay=600.0)
    running = enqueue_one(backend, now=T0, queue="q3")
    lease = claim(backend, "q3", running)
    top = enqueue_one(backend, now=T0, queue="q4")
    waiting = enqueue_one(backend, now=T0, queue="q4", after=(top,))
    child = enqueue_one(backend, now=T0, queue="q5", after=(waiting,))
    succeeded = enqueue_one(backend, now=T0, queue="q6")
    backend.ack(claim(backend, "q6", succeeded), json.dumps("ok"), now=T0)
    dead = enqueue_one(backend, now=T0, queue="q6")
    backend.kill(claim(backend, "q6", dead), ErrorInfo("rejected", "no"), now=T0)
    finished = {i: get(backend, i) for i in (succeeded, dead)}

    ids = [dead, waiting, UNKNOWN, running, succeeded, scheduled, available, running]
    done = version(backend)(ids, now=T0 + 5)

    assert done == sorted([available, scheduled, running, waiting])
    for i in done:
        job = get(backend, i)
        assert (job.state, job.finished_at, job.lease_token) == (JobState.CANCELLED, T0 + 5, None)
    assert {i: get(backend, i) for i in finished} == finished
    assert get(backend, top).state is JobState.AVAILABLE  # a parent is never touched
    cascaded = get(backend, child)  # the waiting job's cancel cascades
    assert cascaded.state is JobState.CANCELLED
    assert cascaded.errors[-1]["kind"] == "parent_failed"
    # The running job's worker is refused from now on, and the reaper leaves it alone.
    assert backend.heartbeat([lease], lease_s=LEASE, now=T0 + 6) == {running}
    with pytest.raises(LeaseLost):
        backend.ack(lease, json.dumps("too late"), now=T0 + 6)
    assert backend.reap(now=T0 + 1000).count == 0
    # Nothing cancelled can be claimed; the unique key is free again.
    for q in ("default", "q2", "q3", "q4", "q5"):
        claimed = backend.claim(q, 10, worker_id="w", lease_s=LEASE, now=T0 + 5000)
        assert [j.id for j in claimed] == ([top] if q == "q4" else [])
    [again] = backend.enqueue_many([new_job(unique_key="u-1")], now=T0 + 6)
    assert again.created and again.id != available
    assert version(backend)([], now=T0) == []


@pytest.mark.needs("dependencies")
@pytest.mark.needs("cross_queue")
def test_a_parent_and_its_child_in_one_call_are_both_cancelled_by_it(backend: Backend) -> None:
    """The stores cancel the call's jobs together, then cascade: a child named in the call is
    cancelled by the call (and counted), its own children by the cascade."""
    parent = enqueue_one(backend, now=T0, queue="q1")
    child = enqueue_one(backend, now=T0, queue="q2", after=(parent,))
    runs_anyway = enqueue_one(backend, now=T0, queue="q2", after=(parent,),
                              on_parent_failure="run")
    grandchild = enqueue_one(backend, now=T0, queue="q3", after=(child,))
    assert backend.cancel_many([child, parent], now=T0 + 1) == [parent, child]
    assert {get(backend, i).state for i in (parent, child, grandchild)} == {JobState.CANCELLED}
    assert get(backend, grandchild).errors[-1]["kind"] == "parent_failed"
    assert get(backend, runs_anyway).state is JobState.AVAILABLE
    [claimed] = backend.claim("q2", 10, worker_id="w", lease_s=LEASE, now=T0 + 2)
    assert claimed.id == runs_anyway


@pytest.mark.needs("dependencies")
@pytest.mark.needs("cross_queue")
def test_a_call_spread_over_many_queues_from_a_client_that_knows_none(
        backend: Backend, open_store: Callable[[], Backend]) -> None:
    """Redis finds each job's queue (and its children's) as cancel does; every store writes
    the lot in one call."""
    jobs = [enqueue_one(backend, now=T0, queue=f"q{i}") for i in range(12)]
    kids = [enqueue_one(backend, now=T0, queue=f"k{i}", after=(j,)) for i, j in enumerate(jobs)]
    assert open_store().cancel_many(jobs[::-1], now=T0 + 1) == jobs
    assert {get(backend, i).state for i in jobs + kids} == {JobState.CANCELLED}


@pytest.mark.needs("dependencies")
@pytest.mark.needs("cross_queue")
def test_cancel_many_wakes_job_wait(backend: Backend) -> None:
    """Waiters on a job the call cancels and on one its cascade cancels are woken by the
    store, not found by polling (the poll is set to ten minutes)."""
    running = enqueue_one(backend, now=T0)
    claim(backend, "default", running)
    parent = enqueue_one(backend, now=T0, queue="q2")
    child = enqueue_one(backend, now=T0, queue="q3", after=(parent,))
    backend.finish_poll = (600.0, 600.0)
    seen: dict[int, Job | None] = {}

    def wait(job_id: int) -> None:
        seen[job_id] = backend.wait_finished(job_id, 20.0)

    threads = [threading.Thread(target=wait, args=(i,), daemon=True) for i in (running, child)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # both waiters are watching
    start = time.monotonic()
    assert backend.cancel_many([running, parent]) == [running, parent]
    for t in threads:
        t.join(15)
    assert time.monotonic() - start < 10
    assert {i: j.state if j else None for i, j in seen.items()} == {
        running: JobState.CANCELLED, child: JobState.CANCELLED}


@pytest.mark.needs("cancel")
@pytest.mark.needs("cross_queue")
def test_bulk_cancel_writes_each_batch_with_one_cancel_many(
        backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = [enqueue_one(backend, now=T0, queue=f"q{i % 3}") for i in range(7)]
    finished = enqueue_one(backend, now=T0)
    assert backend.cancel(finished, now=T0)
    calls: list[list[int]] = []
    real = backend.cancel_many

    def counted(job_ids: Any, *, now: float | None = None) -> list[int]:
        calls.append(list(job_ids))
        return real(job_ids, now=now)

    def refused(job_id: int, *, now: float | None = None) -> bool:
        raise AssertionError("bulk cancel must not cancel one job at a time")

    monkeypatch.setattr(backend, "cancel_many", counted)
    monkeypatch.setattr(backend, "cancel", refused)
    done, cursor = 0, None
    while True:
        result = run_batch(backend, BulkAction.CANCEL, JobFilter(), limit=3, cursor=cursor,
                           now=T0 + 1)
        done += result.done
        cursor = result.cursor
        if cursor is None:
            break
    assert done == 7
    assert len(calls) == 3 and all(1 <= len(c) <= 3 for c in calls)
    assert sorted(i for c in calls for i in c) == ids
    assert {get(backend, i).state for i in ids} == {JobState.CANCELLED}
