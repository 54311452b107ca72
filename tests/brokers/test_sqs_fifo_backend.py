"""BrokerBackend on SQS FIFO queues (``sqs://...&fifo=true``, moto's server): unique keys as
deduplication ids, fair keys as message groups, and delays and retries without per-message
DelaySeconds. The shared lifecycle and fencing checks run on this broker too
(test_broker_semantics.py, broker ``sqs-fifo``).

Where moto differs from SQS (docs/backends.md, "FIFO queues"): moto deduplicates only against
messages still in the queue, SQS against any sent in the last 5 minutes. The tests keep the
first message in the queue while they send its duplicates, where both drop them.

Conditions are awaited by polling with a deadline (support.wait_until), never by fixed sleeps.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from support import new_job, wait_until

from conveyor.backends import open_backend
from conveyor.backends.base import ErrorInfo, Lease
from conveyor.backends.broker import BrokerBackend
from conveyor.backends.broker.message import Body
from conveyor.job import Job, JobState

Q = "jobs"


@pytest.fixture
def fifo_url(sqs_url: str) -> str:
    return f"{sqs_url}&fifo=true"


@pytest.fixture
def fifo(fifo_url: str) -> Iterator[BrokerBackend]:
    b = open_backend(fifo_url)
    assert isinstance(b, BrokerBackend)
    try:
        yield b
    finally:
        b.close()


def lease(job: Job) -> Lease:
    assert job.lease_token is not None
    return Lease(job.id, job.lease_token)


def claim(b: BrokerBackend, n: int = 1, queue: str = Q) -> list[Job]:
    return b.claim(queue, n, worker_id="w", lease_s=30)


def claim_soon(b: BrokerBackend, n: int = 1, queue: str = Q) -> list[Job]:
    got: list[Job] = []

    def more() -> bool:
        got.extend(claim(b, n - len(got), queue))
        return len(got) >= n

    wait_until(more, timeout=15, message=f"{n} claimable job(s)")
    return got


def test_unique_and_fair_are_not_missing(fifo: BrokerBackend, sqs_url: str) -> None:
    assert "unique" not in fifo.missing and "fair" not in fifo.missing
    assert {"lookup", "limits", "cron"} <= fifo.missing
    standard = open_backend(sqs_url)
    try:
        assert {"unique", "fair"} <= standard.missing
    finally:
        standard.close()


def test_a_second_job_with_the_key_is_dropped_by_sqs(fifo: BrokerBackend) -> None:
    [first] = fifo.enqueue_many([new_job(queue=Q, args={"n": 1}, unique_key="report:7")])
    again = fifo.enqueue_many([new_job(queue=Q, args={"n": 2}, unique_key="report:7"),
                               new_job(queue=Q, args={"n": 3}, unique_key="report:8")])
    # SQS acknowledges a duplicate as sent: the producer cannot tell it from a new job.
    assert first.created and all(r.created for r in again)
    got = claim_soon(fifo, 2)
    assert sorted((j.args["n"], j.unique_key) for j in got) == [(1, "report:7"), (3, "report:8")]
    assert got[0].id in (first.id, again[1].id)
    assert claim(fifo, 10) == []
    fifo.ack_many([(lease(j), None) for j in got])


def test_jobs_without_a_key_are_never_duplicates(fifo: BrokerBackend) -> None:
    fifo.enqueue_many([new_job(queue=Q, args={"n": 1}) for _ in range(5)])
    assert len(claim_soon(fifo, 5)) == 5


def test_the_key_holds_per_sqs_queue(fifo: BrokerBackend) -> None:
    """SQS deduplicates within one queue: another Conveyor queue or priority lane has its
    own (docs/backends.md says so)."""
    fifo.enqueue_many([new_job(queue=Q, unique_key="k"), new_job(queue="other", unique_key="k"),
                       new_job(queue=Q, unique_key="k", priority=1)])
    assert len(claim_soon(fifo, 2)) == 2  # lanes -1, 0, 1: priority 0 and 1 are two
    assert len(claim_soon(fifo, 1, queue="other")) == 1


def test_a_tenant_runs_in_order_and_tenants_side_by_side(fifo: BrokerBackend) -> None:
    fifo.enqueue_many([new_job(queue=Q, args={"n": f"a{i}"}, fair_key="a") for i in range(10)])
    fifo.enqueue_many([new_job(queue=Q, args={"n": f"b{i}"}, fair_key="b") for i in range(2)])
    [a0] = claim(fifo)
    # Tenant a's backlog does not hold tenant b back: b0 is next, not a1.
    [b0] = claim(fifo)
    assert (a0.args["n"], a0.fair_key, b0.args["n"]) == ("a0", "a", "b0")
    assert claim(fifo, 10) == []  # each tenant's next waits for its job in hand
    fifo.ack(lease(a0), None)
    [a1] = claim_soon(fifo)
    assert a1.args["n"] == "a1"
    fifo.ack_many([(lease(b0), None), (lease(a1), None)])
    seen = []
    while len(seen) < 9:
        [j] = claim_soon(fifo)
        seen.append(j.args["n"])
        fifo.ack(lease(j), None)
    assert [n for n in seen if n.startswith("a")] == [f"a{i}" for i in range(2, 10)]
    assert "b1" in seen


def test_a_claim_may_take_several_jobs_of_one_tenant_in_order(fifo: BrokerBackend) -> None:
    fifo.enqueue_many([new_job(queue=Q, args={"n": i}, fair_key="a") for i in range(4)])
    got = claim_soon(fifo, 4)
    assert [j.args["n"] for j in got] == [0, 1, 2, 3]


def test_a_delayed_job_waits_outside_its_group(fifo: BrokerBackend) -> None:
    before = time.time()
    fifo.enqueue_many([new_job(queue=Q, args={"n": "later"}, fair_key="a", delay=1.5)])
    fifo.enqueue_many([new_job(queue=Q, args={"n": "now"}, fair_key="a")])
    [now] = claim(fifo)
    assert now.args["n"] == "now"  # the delayed job holds no place in its tenant's line
    [stats] = fifo.stats().queues
    assert (stats.scheduled, stats.running) == (1, 1)
    fifo.ack(lease(now), None)
    [later] = claim_soon(fifo)
    assert later.args["n"] == "later" and time.time() >= before + 1.5


def test_a_retry_with_backoff_on_fifo(fifo: BrokerBackend) -> None:
    fifo.enqueue_many([new_job(queue=Q, args={"n": i}, fair_key="a", max_attempts=2)
                       for i in range(2)])
    [first] = claim(fifo)
    state = fifo.retry(lease(first), ErrorInfo("exception", "boom"), delay=1.5)
    assert state is JobState.SCHEDULED
    # The backoff does not hold the tenant's next job.
    [second] = claim_soon(fifo)
    assert second.args["n"] == 1
    fifo.ack(lease(second), None)
    [again] = claim_soon(fifo)
    assert (again.id, again.attempts, again.fair_key) == (first.id, 2, "a")
    assert [e["message"] for e in again.errors] == ["boom"]
    assert fifo.retry(lease(again), ErrorInfo("exception", "last"), delay=0) is JobState.DEAD
    [dead] = fifo.list_jobs(state=JobState.DEAD, queue=Q).jobs
    assert (dead.id, dead.attempts) == (first.id, 2)
    # Redriven, it goes back to its tenant's line.
    assert fifo.redrive(queue=Q) == 1
    [back] = claim_soon(fifo)
    assert (back.id, back.fair_key, back.attempts) == (first.id, "a", 1)


def test_a_retry_is_not_dropped_as_a_duplicate_of_its_job(fifo: BrokerBackend) -> None:
    fifo.enqueue_many([new_job(queue=Q, unique_key="k", max_attempts=3)])
    [j1] = claim_soon(fifo)
    fifo.retry(lease(j1), ErrorInfo("exception", "boom"), delay=0)
    [j2] = claim_soon(fifo)
    fifo.release([lease(j2)])
    [j3] = claim_soon(fifo)
    assert (j1.id, j2.attempts, j3.attempts) == (j3.id, 2, 2)
    fifo.ack(lease(j3), None)


def test_a_job_that_comes_out_early_waits_again_in_the_delay_queue(
        fifo: BrokerBackend) -> None:
    """Past SQS's 15 minutes a delayed job comes out early (or a producer's clock runs
    ahead): the claim publishes it again for the rest, in its group."""
    at = time.time()
    body = Body(id=1234, uid="u", task="t.task", queue=Q, args="{}", meta="{}", priority=0,
                max_attempts=3, timeout=30.0, created_at=at, run_at=at + 1.5, fair_key="a")
    fifo.transport.publish([fifo._outgoing(fifo.lane(Q, 0), body)])
    wait_until(lambda: fifo.stats().queues[0].available == 1, timeout=15)
    assert claim(fifo) == []
    assert fifo.stats().queues[0].scheduled == 1
    [j] = claim_soon(fifo)
    assert (j.id, j.attempts, j.fair_key) == (1234, 1, "a")
    assert time.time() >= at + 1.5 - 0.06  # EARLY: this close, it runs


def test_the_dead_lane_does_not_group_by_tenant(fifo: BrokerBackend) -> None:
    """Listing the dead lane receives every message it shows; tenants' groups there would
    hand out one receive's worth (10) per tenant."""
    fifo.enqueue_many([new_job(queue=Q, args={"n": i}, fair_key="a") for i in range(12)])
    for _ in range(12):
        [j] = claim_soon(fifo)
        fifo.kill(lease(j), ErrorInfo("rejected", "no"))
    dead = fifo.list_jobs(state=JobState.DEAD, queue=Q).jobs
    assert sorted(j.args["n"] for j in dead) == list(range(12))
