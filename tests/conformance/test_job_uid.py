"""Every job carries a ``uid``: 128 random bits written with it at enqueue, which no other job
has, even one that takes the same id after the store lost data (Redis without persistence,
an RDB or backup restore, a failover with replication lag all make ids repeat). Step records
are bound to it, so a step recorded by one job is never read by, or written onto, another."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from dataloss import forget_uid, lose_everything
from support import T0, claims_in_order, new_job, running_worker, wait_for_job

from conveyor import Conveyor, current_job
from conveyor.backends.base import Backend, ErrorInfo, Lease
from conveyor.errors import JobNotFound, LeaseLost
from conveyor.executor import JobContext
from conveyor.job import Job

HEX32 = re.compile(r"[0-9a-f]{32}")


def _claim_one(backend: Backend, now: float = T0) -> Job:
    [job] = backend.claim("default", 1, worker_id="w", lease_s=30, now=now)
    return job


def _lease(job: Job) -> Lease:
    assert job.lease_token is not None
    return Lease(job.id, job.lease_token)


@pytest.mark.needs("fair", "unique")
def test_every_job_gets_a_uid_of_its_own(backend: Backend) -> None:
    batch = [
        new_job(args={"n": 0}),
        new_job(args={"n": 1}, unique_key="u-1"),
        new_job(args={"n": 2}, fair_key="tenant-a"),
        new_job(args={"n": 3}, delay=60),
        new_job(args={"n": 4}, concurrency_key="c", concurrency_limit=2),
    ]
    one = new_job(args={"n": 5})
    # The same NewJob written twice is two jobs: two uids.
    results = [*backend.enqueue_many(batch, now=T0), *backend.enqueue_many([one], now=T0),
               *backend.enqueue_many([one, one], now=T0)]
    uids = [r.uid for r in results]
    assert all(isinstance(u, str) and HEX32.fullmatch(u) for u in uids), uids
    assert len(set(uids)) == len(uids)
    for r in results:
        job = backend.get(r.id)
        assert job is not None and job.uid == r.uid
    # A unique key held by an unfinished job returns that job, not a new uid.
    [again] = backend.enqueue_many([new_job(args={"n": 9}, unique_key="u-1")], now=T0)
    assert not again.created and again.id == results[1].id
    claimed = backend.claim("default", 10, worker_id="w", lease_s=30, now=T0 + 1)
    assert {j.id: j.uid for j in claimed} == {r.id: r.uid for r in results if r.id != results[3].id}


@pytest.mark.needs("clock")
def test_the_uid_stays_with_the_job_through_retries_expiry_and_redrive(backend: Backend) -> None:
    [made] = backend.enqueue_many([new_job(max_attempts=3)], now=T0)
    first = _claim_one(backend, now=T0)
    assert first.uid == made.uid
    backend.retry(_lease(first), ErrorInfo("exception", "boom"), delay=0, now=T0 + 1)
    second = _claim_one(backend, now=T0 + 2)
    assert second.attempts == 2 and second.uid == made.uid
    backend.reap(now=T0 + 100)  # its lease ran out
    third = _claim_one(backend, now=T0 + 101)
    assert third.attempts == 3 and third.uid == made.uid
    backend.kill(_lease(third), ErrorInfo("rejected", "no"), now=T0 + 102)
    assert backend.redrive([made.id], now=T0 + 103) == 1
    again = _claim_one(backend, now=T0 + 104)
    assert again.uid == made.uid and backend.get(made.id).uid == made.uid  # type: ignore[union-attr]


@pytest.mark.needs("steps")
def test_a_step_record_names_the_uid_of_its_job(backend: Backend) -> None:
    [made] = backend.enqueue_many([new_job()], now=T0)
    assert backend.record_step(made.id, "charge", '"ch_1"', uid=made.uid) == (True, '"ch_1"')
    with pytest.raises(JobNotFound):
        backend.record_step(made.id, "charge", '"ch_2"', uid="0" * 32)
    with pytest.raises(JobNotFound):
        backend.record_step(made.id, "refund", '"re_1"', uid="0" * 32)
    with pytest.raises(JobNotFound):
        backend.record_step(made.id, "refund", '"re_1"', uid=None)  # a job without uid is another job
    job = backend.get(made.id)
    assert job is not None and job.steps == {"charge": "ch_1"}


@pytest.mark.needs("steps")
def test_a_step_of_a_lost_job_never_reaches_the_job_that_takes_its_id(backend: Backend) -> None:
    """Order A is claimed and charged; the store then loses it and its id counter. Order B
    takes A's id. A's attempt, still running, records a step late and settles: none of it may
    land on B, and B must run its own charge."""
    [a_made] = backend.enqueue_many([new_job(args={"order": "A"})], now=T0)
    a = _claim_one(backend, now=T0)
    a_ctx = JobContext(a, backend)
    assert a_ctx.once("charge", lambda: {"charged": "A"}) == {"charged": "A"}

    lose_everything(backend)
    [b_made] = backend.enqueue_many([new_job(args={"order": "B"})], now=T0 + 1)
    assert b_made.id == a.id, "the simulated loss should make the id repeat"
    assert b_made.uid != a_made.uid

    # A's attempt goes on: a step recorded late, a heartbeat and an ack are all refused.
    with pytest.raises(JobNotFound):
        a_ctx.once("refund", lambda: {"refunded": "A"})
    assert backend.heartbeat([_lease(a)], lease_s=30, now=T0 + 2) == {a.id}
    with pytest.raises(LeaseLost):
        backend.ack(_lease(a), json.dumps("A done"), now=T0 + 2)

    b = _claim_one(backend, now=T0 + 3)
    assert b.id == a.id and b.args == {"order": "B"} and b.steps == {}
    # Now B runs under a lease of its own: A's lease still settles nothing.
    with pytest.raises(LeaseLost):
        backend.ack(_lease(a), json.dumps("A done"), now=T0 + 4)
    with pytest.raises(LeaseLost):
        backend.retry(_lease(a), ErrorInfo("exception", "late"), delay=0, now=T0 + 4)
    with pytest.raises(LeaseLost):
        backend.kill(_lease(a), ErrorInfo("rejected", "late"), now=T0 + 4)
    assert backend.ack_many([(_lease(a), json.dumps("A done"))], now=T0 + 4) == [False]
    assert backend.release([_lease(a)], now=T0 + 4) == []
    assert backend.heartbeat([_lease(a)], lease_s=30, now=T0 + 4) == {a.id}
    with pytest.raises(JobNotFound):
        a_ctx._record("charge", {"charged": "A"})  # even past A's cached steps

    charged = []
    b_ctx = JobContext(b, backend)
    assert b_ctx.once("charge", lambda: charged.append("B") or {"charged": "B"}) == {"charged": "B"}
    assert charged == ["B"]
    backend.ack(_lease(b), json.dumps("B done"), now=T0 + 5)
    done = backend.get(b.id)
    assert done is not None and done.uid == b_made.uid
    assert done.result == "B done" and done.steps == {"charge": {"charged": "B"}}


def test_the_task_context_gives_the_uid_for_idempotency_keys(backend: Backend) -> None:
    made = backend.enqueue_many([new_job(), new_job()], now=T0)
    jobs = backend.claim("default", 2, worker_id="w", lease_s=30, now=T0)
    keys = {JobContext(j, backend).uid for j in jobs}
    assert keys == {r.uid for r in made}


@pytest.mark.needs("steps")
def test_a_job_from_before_uids_still_runs_its_steps(backend: Backend) -> None:
    """A PostgreSQL or SQLite store migrated from an earlier version keeps its old rows without
    a uid (NULL), as does a Redis job hash written by an earlier version."""
    [made] = backend.enqueue_many([new_job()], now=T0)
    [other] = backend.enqueue_many([new_job()], now=T0)
    forget_uid(backend, made.id)
    forget_uid(backend, other.id)
    job = _claim_one(backend, now=T0)
    if claims_in_order(backend):
        assert job.id == made.id
    else:  # a broker's claim may take either of the two, both without a uid
        assert job.id in (made.id, other.id)
        if job.id == other.id:
            made, other = other, made
    assert job.uid is None
    assert backend.get(made.id) == replace(job, lease_token=job.lease_token)
    ctx = JobContext(job, backend)
    assert ctx.once("charge", lambda: "ch_1") == "ch_1"
    with pytest.raises(JobNotFound):
        backend.record_step(made.id, "charge", '"ch_2"', uid=made.uid)
    assert backend.record_step(made.id, "charge", '"ch_2"', uid=None) == (False, '"ch_1"')
    # Its idempotency key is still a str of its own, not "None".
    other_ctx = JobContext(_claim_one(backend, now=T0), backend)
    assert isinstance(ctx.uid, str) and ctx.uid != other_ctx.uid and "None" not in ctx.uid
    backend.ack(_lease(job), None, now=T0 + 1)
    done = backend.get(made.id)
    assert done is not None and done.state == "succeeded" and done.steps == {"charge": "ch_1"}


@pytest.mark.needs("lookup")
def test_a_task_builds_its_idempotency_keys_from_the_uid(app: Conveyor) -> None:
    """Through the public API: the enqueued Job carries the uid, and every attempt of the
    task sees the same one (the advice: ``f"{ctx.uid}:{step}"``)."""
    keys: list[str] = []

    @app.task(name="checkout", max_attempts=2)
    def checkout(order: int) -> None:
        ctx = current_job()
        assert ctx is not None
        keys.append(f"{ctx.uid}:charge")
        if ctx.attempt == 1:
            raise RuntimeError("retry me")

    first, second = checkout.enqueue(1), checkout.enqueue(2)
    assert first.uid is not None and HEX32.fullmatch(first.uid) and first.uid != second.uid
    assert app.get_job(first.id).uid == first.uid  # type: ignore[union-attr]
    with running_worker(app):
        for job in (first, second):
            assert wait_for_job(app, job.id, timeout=20).state == "succeeded"
    assert sorted(keys) == sorted([f"{first.uid}:charge"] * 2 + [f"{second.uid}:charge"] * 2)


@pytest.mark.needs("lookup")
def test_a_job_that_takes_a_running_jobs_id_stays_heartbeated(app: Conveyor) -> None:
    """After a data loss the store can hand a worker a new job under the id of one it still
    runs. When the old one ends, the new one must stay in the worker's heartbeats: dropped, its
    lease would expire mid-run and the job would run a second time."""
    import threading

    from dataloss import lose_everything
    from support import running_worker, wait_for_job, wait_until

    first_gate, second_gate = threading.Event(), threading.Event()
    started: list[str] = []

    @app.task(name="first", max_attempts=1)
    def first() -> None:
        started.append("first")
        first_gate.wait(60)

    @app.task(name="second", max_attempts=3)
    def second() -> None:
        started.append("second")
        second_gate.wait(60)

    try:
        with running_worker(app, concurrency=2, visibility_timeout=1.0):
            old = first.enqueue()
            wait_until(lambda: "first" in started, timeout=10, message="the first job runs")
            lose_everything(app.backend)
            new = second.enqueue()
            assert new.id == old.id
            wait_until(lambda: "second" in started, timeout=10, message="the new job runs")
            first_gate.set()  # the old job ends (its ack refused: the store lost it)
            lease = app.get_job(new.id)
            assert lease is not None and lease.lease_expires_at is not None
            # Past two lease lengths, heartbeats alone keep the new job running.
            renewed = lease.lease_expires_at + 2.0

            def renewed_past() -> bool:
                job = app.get_job(new.id)
                return (job is not None and job.state.value == "running"
                        and (job.lease_expires_at or 0) > renewed)

            wait_until(renewed_past, timeout=20, message="the new job's lease renewed by heartbeat")
            second_gate.set()
            done = wait_for_job(app, new.id, "succeeded", timeout=20)
            assert done.attempts == 1
            assert started.count("second") == 1
    finally:
        first_gate.set()
        second_gate.set()
