"""Backend contract for workflows: dependencies (``after``), the ``waiting`` state, cascades,
batches and their callbacks, retention of a workflow's jobs (backends/base.py, "Dependencies").

These talk to the Backend only; the app's chain/batch API has its own tests."""

from __future__ import annotations

import json
import threading

import pytest
from support import T0, enqueue_one, new_job

from conveyor import JobState
from conveyor.backends.base import Backend, BatchInfo, ErrorInfo, Lease, NewBatch
from conveyor.errors import UnknownParent
from conveyor.job import Job

LEASE = 30.0


def get(backend: Backend, job_id: int) -> Job:
    job = backend.get(job_id)
    assert job is not None
    return job


def state(backend: Backend, job_id: int) -> JobState:
    return get(backend, job_id).state


def take(backend: Backend, job_id: int, *, now: float = T0) -> Lease:
    """Claim exactly ``job_id`` (giving back whatever else the claim took) and return its lease."""
    queue = get(backend, job_id).queue
    claimed = backend.claim(queue, 1000, worker_id="w", lease_s=LEASE, now=now)
    mine = [j for j in claimed if j.id == job_id]
    others = [Lease(j.id, j.lease_token or "") for j in claimed if j.id != job_id]
    if others:
        backend.release(others, now=now)
    assert mine, f"job {job_id} was not claimable"
    [job] = mine
    assert job.lease_token is not None
    return Lease(job.id, job.lease_token)


def succeed(backend: Backend, job_id: int, result: object = "ok", *, now: float = T0) -> None:
    backend.ack(take(backend, job_id, now=now), json.dumps(result), now=now)


def kill(backend: Backend, job_id: int, *, now: float = T0) -> None:
    backend.kill(take(backend, job_id, now=now), ErrorInfo("rejected", "dead for the test"),
                 now=now)


def enqueue(backend: Backend, *, now: float = T0, **kw: object) -> int:
    return enqueue_one(backend, now=now, **kw)


# -- the waiting state ------------------------------------------------------------------------


@pytest.mark.needs("dependencies")
def test_a_child_waits_until_its_parent_succeeds(backend: Backend) -> None:
    parent = enqueue(backend)
    child = enqueue(backend, after=(parent,))
    job = get(backend, child)
    assert job.state is JobState.WAITING
    assert job.parents == (parent,)
    assert job.on_parent_failure == "cancel"

    claimed = backend.claim("default", 10, worker_id="w", lease_s=LEASE, now=T0)
    assert [j.id for j in claimed] == [parent]  # never the waiting child
    backend.ack(Lease(parent, claimed[0].lease_token or ""), json.dumps(1), now=T0 + 1)

    assert state(backend, child) is JobState.AVAILABLE
    [again] = backend.claim("default", 10, worker_id="w", lease_s=LEASE, now=T0 + 2)
    assert again.id == child


@pytest.mark.needs("dependencies")
def test_waiting_jobs_are_counted_apart_from_depth(backend: Backend) -> None:
    parent = enqueue(backend)
    for _ in range(3):
        enqueue(backend, after=(parent,))
    [q] = [q for q in backend.stats(now=T0).queues if q.queue == "default"]
    assert q.waiting == 3
    assert q.available == 1
    assert q.depth == 1
    listed = backend.list_jobs(state=JobState.WAITING)
    assert len(listed.jobs) == 3


@pytest.mark.needs("dependencies")
def test_a_chain_written_at_once_refers_to_earlier_positions(backend: Backend) -> None:
    res = backend.enqueue_many([
        new_job(args={"step": 1}),
        new_job(args={"step": 2}, after_refs=(0,)),
        new_job(args={"step": 3}, after_refs=(1,)),
    ], now=T0)
    a, b, c = (r.id for r in res)
    assert [state(backend, i) for i in (a, b, c)] == [
        JobState.AVAILABLE, JobState.WAITING, JobState.WAITING]
    assert get(backend, b).parents == (a,)
    assert get(backend, c).parents == (b,)
    succeed(backend, a, now=T0 + 1)
    assert [state(backend, i) for i in (b, c)] == [JobState.AVAILABLE, JobState.WAITING]
    succeed(backend, b, now=T0 + 2)
    assert state(backend, c) is JobState.AVAILABLE


@pytest.mark.needs("dependencies")
def test_a_child_of_many_parents_leaves_waiting_with_the_last(backend: Backend) -> None:
    parents = [enqueue(backend) for _ in range(3)]
    child = enqueue(backend, after=tuple(parents))
    assert get(backend, child).parents == tuple(sorted(parents))
    succeed(backend, parents[2])
    succeed(backend, parents[0])
    assert state(backend, child) is JobState.WAITING
    succeed(backend, parents[1])
    assert state(backend, child) is JobState.AVAILABLE


@pytest.mark.needs("dependencies")
def test_a_delayed_child_becomes_scheduled_not_available(backend: Backend) -> None:
    parent = enqueue(backend)
    child = enqueue(backend, after=(parent,), delay=600.0)
    succeed(backend, parent, now=T0 + 1)
    assert state(backend, child) is JobState.SCHEDULED
    assert backend.promote(now=T0 + 601) >= 1
    assert state(backend, child) is JobState.AVAILABLE


# -- refusals -----------------------------------------------------------------------------------


@pytest.mark.needs("dependencies")
def test_an_unknown_parent_is_refused_and_nothing_is_written(backend: Backend) -> None:
    with pytest.raises(UnknownParent):
        backend.enqueue_many([new_job(), new_job(after=(987_654_321,))], now=T0)
    assert backend.list_jobs(limit=100).jobs == []


@pytest.mark.parametrize("refs", [(0,), (1,), (-1,)])
@pytest.mark.needs("dependencies")
def test_a_reference_to_itself_or_a_later_job_is_refused(backend: Backend,
                                                        refs: tuple[int, ...]) -> None:
    with pytest.raises(UnknownParent):
        backend.enqueue_many([new_job(after_refs=refs), new_job()], now=T0)
    assert backend.list_jobs(limit=100).jobs == []


# -- parents that finished before the child was written ---------------------------------------


@pytest.mark.needs("dependencies", "lookup")
def test_a_parent_already_succeeded_counts_as_done(backend: Backend) -> None:
    parent = enqueue(backend)
    succeed(backend, parent)
    child = enqueue(backend, after=(parent,), now=T0 + 1)
    assert state(backend, child) is JobState.AVAILABLE
    assert get(backend, child).parents == (parent,)


@pytest.mark.parametrize("mode, expected", [("cancel", JobState.CANCELLED),
                                            ("run", JobState.AVAILABLE)])
@pytest.mark.needs("dependencies", "lookup")
def test_a_parent_already_dead(backend: Backend, mode: str, expected: JobState) -> None:
    parent = enqueue(backend)
    kill(backend, parent)
    child = enqueue(backend, after=(parent,), on_parent_failure=mode, now=T0 + 1)
    assert state(backend, child) is expected


# -- failure: cancel or run, and the cascade ---------------------------------------------------


@pytest.mark.needs("dependencies")
def test_a_dead_parent_cancels_its_descendants(backend: Backend) -> None:
    a = enqueue(backend)
    b = enqueue(backend, after=(a,))
    c = enqueue(backend, after=(b,))
    sibling_parent = enqueue(backend)
    unrelated = enqueue(backend, after=(sibling_parent,))
    kill(backend, a, now=T0 + 1)
    assert state(backend, b) is JobState.CANCELLED
    assert state(backend, c) is JobState.CANCELLED
    assert state(backend, unrelated) is JobState.WAITING
    err = get(backend, b).last_error
    assert err is not None and err["kind"] == "parent_failed"
    assert str(a) in err["message"]
    assert get(backend, b).finished_at is not None


@pytest.mark.needs("dependencies")
def test_a_child_that_runs_on_parent_failure_waits_for_every_parent(backend: Backend) -> None:
    failing = enqueue(backend)
    slow = enqueue(backend)
    child = enqueue(backend, after=(failing, slow), on_parent_failure="run")
    grandchild = enqueue(backend, after=(child,))
    kill(backend, failing)
    assert state(backend, child) is JobState.WAITING
    succeed(backend, slow)
    assert state(backend, child) is JobState.AVAILABLE
    assert state(backend, grandchild) is JobState.WAITING


@pytest.mark.needs("dependencies")
def test_retries_used_up_count_as_a_dead_parent(backend: Backend) -> None:
    parent = enqueue(backend, max_attempts=1)
    child = enqueue(backend, after=(parent,))
    new_state = backend.retry(take(backend, parent), ErrorInfo("exception", "boom"), delay=0.0,
                              now=T0)
    assert new_state is JobState.DEAD
    assert state(backend, child) is JobState.CANCELLED


@pytest.mark.needs("dependencies")
def test_a_retry_with_attempts_left_keeps_the_child_waiting(backend: Backend) -> None:
    parent = enqueue(backend, max_attempts=3)
    child = enqueue(backend, after=(parent,))
    backend.retry(take(backend, parent), ErrorInfo("exception", "boom"), delay=0.0, now=T0)
    assert state(backend, child) is JobState.WAITING


@pytest.mark.needs("dependencies")
def test_a_lease_that_expires_for_good_settles_the_children(backend: Backend) -> None:
    parent = enqueue(backend, max_attempts=1)
    child = enqueue(backend, after=(parent,), on_parent_failure="run")
    lease = take(backend, parent)
    # Started (not a held prefetch), so the expiry costs the attempt.
    backend.heartbeat([lease], lease_s=LEASE, now=T0 + 1)
    reaped = backend.reap(now=T0 + LEASE + 10)
    assert parent in reaped.dead
    assert state(backend, child) is JobState.AVAILABLE


@pytest.mark.needs("dependencies")
def test_cancelling_a_parent_cancels_its_children(backend: Backend) -> None:
    parent = enqueue(backend)
    child = enqueue(backend, after=(parent,))
    runs_anyway = enqueue(backend, after=(parent,), on_parent_failure="run")
    assert backend.cancel(parent, now=T0 + 1)
    assert state(backend, child) is JobState.CANCELLED
    assert state(backend, runs_anyway) is JobState.AVAILABLE


@pytest.mark.needs("dependencies")
def test_cancelling_a_waiting_job_cascades_to_its_children(backend: Backend) -> None:
    parent = enqueue(backend)
    child = enqueue(backend, after=(parent,))
    grandchild = enqueue(backend, after=(child,))
    assert backend.cancel(child, now=T0 + 1)
    assert state(backend, child) is JobState.CANCELLED
    assert state(backend, grandchild) is JobState.CANCELLED
    assert state(backend, parent) is JobState.AVAILABLE


@pytest.mark.needs("dependencies")
def test_redrive_of_a_dead_parent_does_not_revive_cancelled_children(backend: Backend) -> None:
    parent = enqueue(backend)
    child = enqueue(backend, after=(parent,))
    kill(backend, parent)
    assert backend.redrive([parent], now=T0 + 1) == 1
    assert state(backend, parent) is JobState.AVAILABLE
    assert state(backend, child) is JobState.CANCELLED


@pytest.mark.needs("dependencies")
def test_a_long_chain_cancels_to_its_end(backend: Backend) -> None:
    res = backend.enqueue_many(
        [new_job()] + [new_job(after_refs=(i,)) for i in range(200)], now=T0)
    ids = [r.id for r in res]
    kill(backend, ids[0])
    assert {state(backend, i) for i in ids[1:]} == {JobState.CANCELLED}


# -- every finishing path settles children -------------------------------------------------------


@pytest.mark.needs("dependencies")
def test_ack_many_and_ack_and_claim_release_children(backend: Backend) -> None:
    p1, p2, p3 = (enqueue(backend) for _ in range(3))
    c12 = enqueue(backend, after=(p1, p2))
    c3 = enqueue(backend, after=(p3,))
    claimed = backend.claim("default", 3, worker_id="w", lease_s=LEASE, now=T0)
    leases = {j.id: Lease(j.id, j.lease_token or "") for j in claimed}
    assert backend.ack_many([(leases[p1], None), (leases[p2], None)], now=T0 + 1) == [True, True]
    assert state(backend, c12) is JobState.AVAILABLE
    held, _ = backend.ack_and_claim([(leases[p3], None)], "other", 1, worker_id="w",
                                    lease_s=LEASE, now=T0 + 2)
    assert held == [True]
    assert state(backend, c3) is JobState.AVAILABLE


@pytest.mark.needs("dependencies")
@pytest.mark.needs("cross_queue")
def test_concurrent_parents_release_their_child_exactly_once(backend: Backend) -> None:
    parents = [enqueue(backend) for _ in range(40)]
    child = enqueue(backend, after=tuple(parents), queue="children")
    claimed = backend.claim("default", 40, worker_id="w", lease_s=LEASE, now=T0)
    leases = [Lease(j.id, j.lease_token or "") for j in claimed]
    assert len(leases) == 40
    chunks = [leases[i::8] for i in range(8)]
    errors: list[BaseException] = []

    def ack(chunk: list[Lease]) -> None:
        try:
            for lease in chunk:
                backend.ack_many([(lease, None)], now=T0 + 1)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=ack, args=(c,)) for c in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert state(backend, child) is JobState.AVAILABLE
    first = backend.claim("children", 10, worker_id="w", lease_s=LEASE, now=T0 + 2)
    assert [j.id for j in first] == [child]
    assert backend.claim("children", 10, worker_id="w", lease_s=LEASE, now=T0 + 3) == []


@pytest.mark.needs("dependencies", "lookup")
@pytest.mark.needs("cross_queue")
def test_a_child_written_while_its_parent_finishes_is_never_stranded(backend: Backend) -> None:
    for round_ in range(30):
        parent = enqueue(backend, queue=f"race{round_}")
        lease = take(backend, parent)
        children: list[int] = []
        go = threading.Barrier(2)

        def write_child(parent: int, go: threading.Barrier, children: list[int]) -> None:
            go.wait()
            children.append(enqueue(backend, after=(parent,), queue="kids"))

        t = threading.Thread(target=write_child, args=(parent, go, children))
        t.start()
        go.wait()
        # At the injected clock the lease was taken on: the store's own clock is past its expiry.
        backend.ack(lease, None, now=T0 + 1)
        t.join()
        assert state(backend, children[0]) is JobState.AVAILABLE, f"round {round_}"


# -- batches -----------------------------------------------------------------------------------


def write_batch(backend: Backend, members: int, *, batch_id: str = "b-1",
                parent_id: str | None = None, now: float = T0) -> tuple[list[int], int, int]:
    """A batch of ``members`` jobs with both callbacks; returns (members, on_success,
    on_complete)."""
    jobs = [new_job(args={"n": i}, batch_id=batch_id) for i in range(members)]
    refs = tuple(range(members))
    jobs.append(new_job(task="t.report", callback_of=batch_id, after_refs=refs,
                        batch_id=parent_id))
    jobs.append(new_job(task="t.cleanup", callback_of=batch_id, after_refs=refs,
                        on_parent_failure="run", batch_id=parent_id))
    res = backend.enqueue_many(jobs, now=now, batches=[NewBatch(batch_id, parent_id)])
    ids = [r.id for r in res]
    return ids[:members], ids[-2], ids[-1]


@pytest.mark.needs("dependencies")
def test_a_batch_counts_its_members_and_names_its_callbacks(backend: Backend) -> None:
    members, on_success, on_complete = write_batch(backend, 4)
    info = backend.get_batch("b-1")
    assert isinstance(info, BatchInfo)
    assert (info.total, info.pending, info.succeeded, info.dead) == (4, 4, 0, 0)
    assert (info.on_success, info.on_complete) == (on_success, on_complete)
    assert get(backend, members[0]).batch_id == "b-1"
    assert get(backend, on_success).callback_of == "b-1"
    assert state(backend, on_success) is JobState.WAITING

    for m in members[:3]:
        succeed(backend, m)
    info = backend.get_batch("b-1")
    assert info is not None
    assert (info.pending, info.succeeded, info.is_finished) == (1, 3, False)
    assert state(backend, on_success) is JobState.WAITING
    succeed(backend, members[3])
    info = backend.get_batch("b-1")
    assert info is not None and info.is_finished and info.succeeded == 4
    assert state(backend, on_success) is JobState.AVAILABLE
    assert state(backend, on_complete) is JobState.AVAILABLE
    assert set(get(backend, on_success).parents) == set(members)


@pytest.mark.needs("dependencies")
def test_a_dead_member_cancels_on_success_and_runs_on_complete(backend: Backend) -> None:
    members, on_success, on_complete = write_batch(backend, 3)
    kill(backend, members[0])
    assert state(backend, on_success) is JobState.CANCELLED
    assert state(backend, on_complete) is JobState.WAITING
    succeed(backend, members[1])
    succeed(backend, members[2])
    assert state(backend, on_complete) is JobState.AVAILABLE
    info = backend.get_batch("b-1")
    assert info is not None and (info.succeeded, info.dead, info.is_finished) == (2, 1, True)


@pytest.mark.needs("dependencies")
def test_a_nested_batch_counts_in_its_outer_batch(backend: Backend) -> None:
    outer_members = [r.id for r in backend.enqueue_many(
        [new_job(batch_id="outer"), new_job(batch_id="outer")], now=T0,
        batches=[NewBatch("outer")])]
    inner_members, _ok, _done = write_batch(backend, 2, batch_id="inner", parent_id="outer",
                                            now=T0 + 1)
    outer = backend.get_batch("outer")
    inner = backend.get_batch("inner")
    assert outer is not None and inner is not None
    assert inner.parent_id == "outer"
    assert inner.total == 2
    # The outer batch's members: its own two, the inner's two, and the inner's callbacks.
    assert outer.total == 6
    for m in outer_members + inner_members:
        succeed(backend, m)
    outer = backend.get_batch("outer")
    assert outer is not None and outer.succeeded == 4 and outer.waiting == 0
    assert outer.pending == 2  # the inner callbacks are available now


@pytest.mark.needs("dependencies")
def test_an_unknown_batch_is_none(backend: Backend) -> None:
    assert backend.get_batch("no-such-batch") is None


@pytest.mark.needs("dependencies", "unique")
def test_a_unique_job_already_there_is_the_parent_a_reference_names(backend: Backend) -> None:
    existing = enqueue(backend, unique_key="only-one")
    res = backend.enqueue_many([new_job(unique_key="only-one"), new_job(after_refs=(0,))],
                               now=T0 + 1)
    assert res[0].id == existing and not res[0].created
    assert get(backend, res[1].id).parents == (existing,)
    succeed(backend, existing, now=T0 + 2)
    assert state(backend, res[1].id) is JobState.AVAILABLE


# -- retention ---------------------------------------------------------------------------------


@pytest.mark.needs("dependencies")
def test_prune_keeps_a_finished_parent_while_a_child_is_unfinished(backend: Backend) -> None:
    parent = enqueue(backend)
    other = enqueue(backend)
    slow_parent = enqueue(backend)
    child = enqueue(backend, after=(parent, slow_parent))
    succeed(backend, parent, now=T0)
    succeed(backend, other, now=T0)
    backend.prune(older_than=1.0, now=T0 + 100)
    assert backend.get(other) is None  # an ordinary finished job goes
    assert backend.get(parent) is not None  # its child still waits
    succeed(backend, slow_parent, now=T0 + 101)
    succeed(backend, child, now=T0 + 102)
    backend.prune(older_than=1.0, now=T0 + 200)
    assert [backend.get(i) for i in (parent, slow_parent, child)] == [None, None, None]


@pytest.mark.needs("dependencies")
def test_a_batch_record_goes_with_its_last_member(backend: Backend) -> None:
    members, on_success, on_complete = write_batch(backend, 2)
    for m in members:
        succeed(backend, m, now=T0)
    succeed(backend, on_success, now=T0 + 1)
    succeed(backend, on_complete, now=T0 + 1)
    assert backend.get_batch("b-1") is not None
    backend.prune(older_than=1.0, now=T0 + 500)
    assert backend.get_batch("b-1") is None


@pytest.mark.needs("dependencies")
def test_a_waiting_job_holds_its_unique_key(backend: Backend) -> None:
    parent = enqueue(backend)
    child = enqueue(backend, after=(parent,), unique_key="report:7")
    [again] = backend.enqueue_many([new_job(unique_key="report:7")], now=T0 + 1)
    assert again.id == child and not again.created
    assert backend.cancel(parent, now=T0 + 2)  # the child is cancelled: the key is free
    [fresh] = backend.enqueue_many([new_job(unique_key="report:7")], now=T0 + 3)
    assert fresh.created and fresh.id != child


@pytest.mark.needs("dependencies")
def test_purge_of_a_dead_parent_leaves_no_trace_of_its_links(backend: Backend) -> None:
    parent = enqueue(backend)
    child = enqueue(backend, after=(parent,), on_parent_failure="run")
    kill(backend, parent)
    assert state(backend, child) is JobState.AVAILABLE
    assert backend.purge(job_ids=[parent]) == 1
    assert backend.get(parent) is None
    succeed(backend, child, now=T0 + 1)
    backend.prune(older_than=1.0, now=T0 + 100)
    assert backend.get(child) is None
