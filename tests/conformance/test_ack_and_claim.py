"""Backend contract: ack_and_claim, the busy worker's one round trip (acks, then a claim)."""

from __future__ import annotations

import json

import pytest
from support import T0, claims_in_order, enqueue_one

from conveyor import JobState
from conveyor.backends.base import Backend, Lease
from conveyor.job import Job

LEASE = 30.0


def leases(jobs: list[Job]) -> list[Lease]:
    return [Lease(j.id, j.lease_token) for j in jobs if j.lease_token is not None]


@pytest.mark.needs("clock")
def test_acks_land_and_the_next_jobs_are_claimed(backend: Backend) -> None:
    ids = [enqueue_one(backend, args={"n": i}) for i in range(10)]
    first = backend.claim("default", 4, worker_id="w", lease_s=LEASE, now=T0)
    assert [j.id for j in first] == ids[:4]

    held, second = backend.ack_and_claim(
        [(lease, json.dumps({"n": i})) for i, lease in enumerate(leases(first))], "default", 4,
        worker_id="w", lease_s=LEASE, now=T0 + 1)

    assert held == [True] * 4
    assert [j.id for j in second] == ids[4:8]
    for i, job in enumerate(first):
        done = backend.get(job.id)
        assert done is not None and done.state is JobState.SUCCEEDED and done.result == {"n": i}
        assert done.finished_at == T0 + 1
    for job in second:
        assert job.state is JobState.RUNNING and job.attempts == 1 and job.worker_id == "w"
        assert job.lease_expires_at == T0 + 1 + LEASE


@pytest.mark.needs("lookup")
def test_a_refused_ack_changes_nothing_and_does_not_stop_the_rest(backend: Backend) -> None:
    ids = [enqueue_one(backend) for _ in range(4)]
    jobs = backend.claim("default", 2, worker_id="w", lease_s=LEASE, now=T0)
    good, stale = leases(jobs)
    stale = Lease(stale.job_id, "not-the-token")
    before = backend.get(stale.job_id)

    held, claimed = backend.ack_and_claim([(good, None), (stale, None)], "default", 8,
                                          worker_id="w", lease_s=LEASE, now=T0 + 1)

    assert held == [True, False]
    assert backend.get(stale.job_id) == before  # still running under its real lease
    if claims_in_order(backend):
        assert [j.id for j in claimed] == ids[2:]
    else:  # a broker's first claim may have taken any two of the four
        assert sorted(j.id for j in claimed) == sorted(set(ids) - {j.id for j in jobs})


@pytest.mark.needs("lookup")
def test_acks_alone_when_nothing_waits(backend: Backend) -> None:
    enqueue_one(backend)
    jobs = backend.claim("default", 1, worker_id="w", lease_s=LEASE, now=T0)
    held, claimed = backend.ack_and_claim([(lease, None) for lease in leases(jobs)], "default", 3,
                                          worker_id="w", lease_s=LEASE, now=T0 + 1)
    assert held == [True] and claimed == []
    done = backend.get(jobs[0].id)
    assert done is not None and done.state is JobState.SUCCEEDED


@pytest.mark.needs("lookup")
def test_acks_of_other_queues_ride_with_a_claim(backend: Backend) -> None:
    other = enqueue_one(backend, queue="other")
    waiting = enqueue_one(backend, queue="default")
    [job] = backend.claim("other", 1, worker_id="w", lease_s=LEASE, now=T0)
    assert job.id == other
    held, claimed = backend.ack_and_claim([(Lease(job.id, job.lease_token or ""), None)], "default", 1,
                                          worker_id="w", lease_s=LEASE, now=T0 + 1)
    assert held == [True] and [j.id for j in claimed] == [waiting]
    done = backend.get(other)
    assert done is not None and done.state is JobState.SUCCEEDED


def test_a_claim_of_nothing_with_no_acks(backend: Backend) -> None:
    assert backend.ack_and_claim([], "default", 4, worker_id="w", lease_s=LEASE, now=T0) == ([], [])
