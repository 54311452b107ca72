"""Backend contract for fleet operations: dead and failed jobs grouped by cause
(``error_groups``), ``make_due``, and bulk actions on any filter in bounded batches (``bulk``)."""

from __future__ import annotations

import pytest
from support import T0, enqueue_one

from conveyor import JobState
from conveyor.backends.base import Backend, ErrorInfo, Lease
from conveyor.bulk import BulkAction, JobFilter, count
from conveyor.errorgroups import group_key, normalise
from conveyor.job import Job

LEASE = 30.0


def get(backend: Backend, job_id: int) -> Job:
    job = backend.get(job_id)
    assert job is not None
    return job


def claim_one(backend: Backend, queue: str, job_id: int, now: float) -> Lease:
    claimed = backend.claim(queue, 100, worker_id="w", lease_s=LEASE, now=now)
    mine = [j for j in claimed if j.id == job_id]
    backend.release([Lease(j.id, j.lease_token or "") for j in claimed if j.id != job_id],
                    now=now)
    [job] = mine
    return Lease(job.id, job.lease_token or "")


def dead_job(backend: Backend, message: str, *, task: str = "t.a", etype: str = "KeyError",
             queue: str = "default", at: float = T0) -> int:
    job_id = enqueue_one(backend, now=at, task=task, queue=queue)
    lease = claim_one(backend, queue, job_id, at)
    backend.kill(lease, ErrorInfo("exception", message, type=etype), now=at)
    return job_id


def failed_job(backend: Backend, message: str, *, queue: str = "default",
               at: float = T0) -> int:
    """A job that failed once and waits for its retry (scheduled, with an error)."""
    job_id = enqueue_one(backend, now=at, queue=queue, task="t.flaky")
    lease = claim_one(backend, queue, job_id, at)
    state = backend.retry(lease, ErrorInfo("exception", message, type="IOError"), delay=600,
                          now=at)
    assert state is JobState.SCHEDULED
    return job_id


def run_all(backend: Backend, action: BulkAction, where: JobFilter, *, limit: int,
            now: float | None = None) -> tuple[int, int]:
    """Loop as the CLI and dashboard do: (jobs done, calls made)."""
    done, calls, cursor = 0, 0, None
    while True:
        result = backend.bulk(action, where, limit=limit, cursor=cursor, now=now)
        calls += 1
        assert result.done <= limit
        done += result.done
        cursor = result.cursor
        if not result.more:
            return done, calls


# -- error groups ----------------------------------------------------------------------------
@pytest.mark.needs("listing")
def test_dead_jobs_group_by_task_type_and_normalised_message(backend: Backend) -> None:
    a1 = dead_job(backend, "KeyError: 'user_1'", at=T0)
    a2 = dead_job(backend, "KeyError: 'user_22'", at=T0 + 10)
    a3 = dead_job(backend, "KeyError: 'admin'", at=T0 + 5)
    b = dead_job(backend, "KeyError: 'user_1'", task="t.b", at=T0 + 1)
    c = dead_job(backend, "KeyError: 'user_1'", etype="ValueError", at=T0 + 2)
    enqueue_one(backend, now=T0)  # unfinished: no group

    out = backend.error_groups()
    assert out.complete and out.scanned == 5
    assert [g.count for g in out.groups] == [3, 1, 1]
    top = out.groups[0]
    assert (top.task, top.error_type, top.message) == ("t.a", "KeyError", "KeyError: <str>")
    assert top.key == group_key("t.a", "KeyError", normalise("KeyError: 'x'"))
    assert (top.first_seen, top.last_seen) == (T0, T0 + 10)
    assert top.sample_id == max(a1, a2, a3)
    others = {(g.task, g.error_type): g.sample_id for g in out.groups[1:]}
    assert others == {("t.b", "KeyError"): b, ("t.a", "ValueError"): c}
    assert backend.error_groups(limit=1).groups == [top]


@pytest.mark.needs("listing")
def test_error_groups_filter_by_queue_and_task(backend: Backend) -> None:
    dead_job(backend, "boom 1", queue="q1")
    dead_job(backend, "boom 2", queue="q2")
    dead_job(backend, "boom 3", queue="q2", task="t.other")
    assert [g.count for g in backend.error_groups(queue="q2").groups] == [1, 1]
    assert [g.count for g in backend.error_groups(task="t.a").groups] == [2]
    assert backend.error_groups(queue="q1", task="t.other").groups == []


@pytest.mark.needs("listing")
def test_error_groups_of_failed_jobs_waiting_for_a_retry(backend: Backend) -> None:
    f1 = failed_job(backend, "timeout talking to 10.0.0.1")
    f2 = failed_job(backend, "timeout talking to 10.0.0.2")
    enqueue_one(backend, now=T0, delay=600.0)  # scheduled, never failed: not a group
    dead_job(backend, "timeout talking to 10.0.0.1")
    [group] = backend.error_groups(state=JobState.SCHEDULED).groups
    assert (group.task, group.count, group.sample_id) == ("t.flaky", 2, max(f1, f2))
    with pytest.raises(ValueError):
        backend.error_groups(state=JobState.RUNNING)


@pytest.mark.needs("listing")
def test_error_groups_look_at_no_more_than_scan_jobs(backend: Backend) -> None:
    for i in range(5):
        dead_job(backend, f"boom {i}", at=T0 + i)
    out = backend.error_groups(scan=3)
    assert not out.complete
    assert sum(g.count for g in out.groups) == out.scanned == 3
    assert backend.error_groups(scan=6).complete  # complete: fewer than scan were there


# -- make_due ---------------------------------------------------------------------------------
@pytest.mark.needs("pause", "run_now")
def test_make_due_makes_scheduled_jobs_available_now(backend: Backend) -> None:
    later = enqueue_one(backend, now=T0, delay=3600.0)
    other = enqueue_one(backend, now=T0, delay=3600.0)
    ready = enqueue_one(backend, now=T0)
    assert backend.make_due([later, ready, 987_654], now=T0 + 1) == 1
    job = get(backend, later)
    assert job.state is JobState.AVAILABLE and job.run_at == pytest.approx(T0 + 1)
    assert get(backend, other).state is JobState.SCHEDULED
    assert get(backend, ready).state is JobState.AVAILABLE
    claimed = backend.claim("default", 10, worker_id="w", lease_s=LEASE, now=T0 + 1)
    assert {j.id for j in claimed} == {later, ready}
    assert backend.make_due([], now=T0) == 0


# -- bulk actions -----------------------------------------------------------------------------
@pytest.mark.needs("listing")
def test_bulk_retry_redrives_one_error_group_in_batches(backend: Backend) -> None:
    group = [dead_job(backend, f"KeyError: 'user_{i}'", at=T0 + i) for i in range(5)]
    other = dead_job(backend, "ValueError: nope", etype="ValueError")
    key = backend.error_groups().groups[0].key
    where = JobFilter(state=JobState.DEAD, error_group=key)
    assert count(backend, BulkAction.RETRY, where) == (5, True)

    done, calls = run_all(backend, BulkAction.RETRY, where, limit=2, now=T0 + 100)
    assert (done, calls) == (5, 3)
    assert {get(backend, i).state for i in group} == {JobState.AVAILABLE}
    assert all(get(backend, i).attempts == 0 for i in group)
    assert get(backend, other).state is JobState.DEAD
    assert backend.error_groups().groups[0].count == 1


@pytest.mark.needs("listing", "pause")
def test_bulk_retry_makes_failed_jobs_due_now(backend: Backend) -> None:
    failed = failed_job(backend, "flaky")
    never_failed = enqueue_one(backend, now=T0, delay=600.0)
    done, _ = run_all(backend, BulkAction.RETRY, JobFilter(state=JobState.SCHEDULED), limit=10,
                      now=T0 + 1)
    assert done == 1
    assert get(backend, failed).state is JobState.AVAILABLE
    assert get(backend, never_failed).state is JobState.SCHEDULED


@pytest.mark.needs("listing", "pause")
def test_bulk_run_now_on_a_queue(backend: Backend) -> None:
    mine = [enqueue_one(backend, now=T0, queue="q1", delay=600.0) for _ in range(3)]
    theirs = enqueue_one(backend, now=T0, queue="q2", delay=600.0)
    done, _ = run_all(backend, BulkAction.RUN_NOW, JobFilter(queue="q1"), limit=2, now=T0 + 1)
    assert done == 3
    assert {get(backend, i).state for i in mine} == {JobState.AVAILABLE}
    assert get(backend, theirs).state is JobState.SCHEDULED


@pytest.mark.needs("dependencies")
@pytest.mark.needs("cross_queue")
def test_bulk_cancel_cascades_to_waiting_children(backend: Backend) -> None:
    parent = enqueue_one(backend, now=T0, queue="q1")
    child = enqueue_one(backend, now=T0, queue="q2", after=(parent,))
    keep = enqueue_one(backend, now=T0, queue="q2")
    where = JobFilter(state=JobState.AVAILABLE, queue="q1")
    assert count(backend, BulkAction.CANCEL, where) == (1, True)
    done, _ = run_all(backend, BulkAction.CANCEL, where, limit=10, now=T0 + 1)
    assert done == 1
    assert get(backend, parent).state is JobState.CANCELLED
    assert get(backend, child).state is JobState.CANCELLED  # the store's cascade
    assert get(backend, keep).state is JobState.AVAILABLE


@pytest.mark.needs("dependencies")
def test_bulk_cancel_takes_waiting_jobs_too(backend: Backend) -> None:
    parent = enqueue_one(backend, now=T0)
    child = enqueue_one(backend, now=T0, after=(parent,))
    done, _ = run_all(backend, BulkAction.CANCEL, JobFilter(state=JobState.WAITING), limit=10)
    assert done == 1
    assert get(backend, child).state is JobState.CANCELLED
    assert get(backend, parent).state is JobState.AVAILABLE


@pytest.mark.needs("cancel")
def test_bulk_delete_finished_jobs_in_a_time_range(backend: Backend) -> None:
    old = [dead_job(backend, "old", at=T0) for _ in range(3)]
    new = dead_job(backend, "new", at=T0 + 1000)
    cancelled = enqueue_one(backend, now=T0)
    assert backend.cancel(cancelled, now=T0 + 1)
    unfinished = enqueue_one(backend, now=T0)
    where = JobFilter(since=T0 - 1, until=T0 + 500, time_field="finished_at")
    assert count(backend, BulkAction.DELETE, where) == (4, True)
    done, _ = run_all(backend, BulkAction.DELETE, where, limit=2)
    assert done == 4
    assert all(backend.get(i) is None for i in [*old, cancelled])
    assert get(backend, new).state is JobState.DEAD
    assert get(backend, unfinished).state is JobState.AVAILABLE


@pytest.mark.needs("listing")
def test_bulk_filters_on_created_at_and_task(backend: Backend) -> None:
    early = enqueue_one(backend, now=T0, task="t.x")
    late = enqueue_one(backend, now=T0 + 100, task="t.x")
    other = enqueue_one(backend, now=T0 + 100, task="t.y")
    where = JobFilter(task="t.x", since=T0 + 50)
    done, _ = run_all(backend, BulkAction.CANCEL, where, limit=10)
    assert done == 1
    assert get(backend, late).state is JobState.CANCELLED
    assert get(backend, early).state is JobState.AVAILABLE
    assert get(backend, other).state is JobState.AVAILABLE


@pytest.mark.needs("listing")
def test_bulk_search_text(backend: Backend) -> None:
    from support import new_job

    [hit, miss] = backend.enqueue_many(
        [new_job(args={"customer": "acme-7"}), new_job(args={"customer": "globex"})], now=T0)
    done, _ = run_all(backend, BulkAction.CANCEL, JobFilter(search="ACME"), limit=10)
    assert done == 1
    assert get(backend, hit.id).state is JobState.CANCELLED
    assert get(backend, miss.id).state is JobState.AVAILABLE


@pytest.mark.needs("listing")
def test_bulk_acts_on_what_the_filter_selected_when_it_began(backend: Backend) -> None:
    first = [dead_job(backend, "boom") for _ in range(3)]
    result = backend.bulk(BulkAction.DELETE, JobFilter(state=JobState.DEAD), limit=2)
    assert result.done == 2 and result.more
    later = dead_job(backend, "boom")  # a newer id than the cursor: not part of this run
    rest = backend.bulk(BulkAction.DELETE, JobFilter(state=JobState.DEAD), limit=2,
                        cursor=result.cursor)
    assert rest.done == 1 and not rest.more
    assert all(backend.get(i) is None for i in first)
    assert get(backend, later).state is JobState.DEAD
