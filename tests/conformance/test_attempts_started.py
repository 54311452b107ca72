"""An attempt counts only once its job started (issue 32 item 3).

A claim hands out some jobs to start at once (``start``) and holds the rest (prefetch). A lease
that runs out on a held job that never started gives the job back uncounted, as a stall
(``Job.stalls``), up to ``MAX_STALLS`` times; a heartbeat marks the jobs that have started. A
claim whose reply never arrived is given back by its claim id (``release_claim``)."""

from __future__ import annotations

import pytest
from support import T0, enqueue_one

from conveyor import JobState
from conveyor.backends.base import MAX_STALLS, Backend, Lease
from conveyor.job import Job

LEASE = 30.0


def lease_of(job: Job) -> Lease:
    assert job.lease_token is not None
    return Lease(job.id, job.lease_token)


def snapshot(backend: Backend, job_id: int) -> Job:
    job = backend.get(job_id)
    assert job is not None
    return job


@pytest.mark.needs("clock")
def test_held_jobs_whose_lease_expires_go_back_uncounted(backend: Backend) -> None:
    ids = [enqueue_one(backend, max_attempts=1) for _ in range(3)]
    jobs = backend.claim("default", 3, worker_id="w1", lease_s=LEASE, now=T0, start=1)
    assert [j.id for j in jobs] == ids
    assert all(j.attempts == 1 for j in jobs)  # what the task sees if it starts

    reaped = backend.reap(now=T0 + LEASE + 1)
    assert reaped.dead == [ids[0]]
    assert reaped.requeued == ids[1:]

    started = snapshot(backend, ids[0])
    assert started.state is JobState.DEAD
    assert started.attempts == 1 and started.stalls == 0
    assert "mid-job" in started.errors[-1]["message"]
    for job_id in ids[1:]:
        held = snapshot(backend, job_id)
        assert held.state is JobState.AVAILABLE
        assert held.attempts == 0
        assert held.stalls == 1
        assert held.lease_token is None
        assert "before the job started" in held.errors[-1]["message"]
        assert held.errors[-1]["kind"] == "lease_expired"


@pytest.mark.needs("clock")
def test_a_claim_starts_every_job_unless_told_otherwise(backend: Backend) -> None:
    ids = [enqueue_one(backend, max_attempts=1) for _ in range(2)]
    backend.claim("default", 2, worker_id="w1", lease_s=LEASE, now=T0)
    reaped = backend.reap(now=T0 + LEASE + 1)
    assert reaped.dead == ids
    for job_id in ids:
        job = snapshot(backend, job_id)
        assert job.attempts == 1 and job.stalls == 0
        assert "mid-job" in job.errors[-1]["message"]


@pytest.mark.needs("clock")
def test_a_heartbeat_marks_the_jobs_not_held_as_started(backend: Backend) -> None:
    first, second = (enqueue_one(backend, max_attempts=1) for _ in range(2))
    jobs = backend.claim("default", 2, worker_id="w1", lease_s=LEASE, now=T0, start=0)
    # The worker started the first job from its prefetch; the second still waits for a slot.
    lost = backend.heartbeat([lease_of(j) for j in jobs], lease_s=LEASE, now=T0 + 10, held={second})
    assert lost == set()

    reaped = backend.reap(now=T0 + 10 + LEASE + 1)
    assert reaped.dead == [first]
    assert reaped.requeued == [second]
    assert snapshot(backend, second).attempts == 0
    assert snapshot(backend, second).stalls == 1


@pytest.mark.needs("clock")
def test_a_job_that_keeps_getting_lost_unstarted_counts_after_max_stalls(backend: Backend) -> None:
    job_id = enqueue_one(backend, max_attempts=1)
    t = T0
    for n in range(MAX_STALLS):
        backend.claim("default", 1, worker_id="w1", lease_s=LEASE, now=t, start=0)
        t += LEASE + 1
        assert backend.reap(now=t).requeued == [job_id]
        after = snapshot(backend, job_id)
        assert (after.attempts, after.stalls) == (0, n + 1)
    backend.claim("default", 1, worker_id="w1", lease_s=LEASE, now=t, start=0)
    t += LEASE + 1
    assert backend.reap(now=t).dead == [job_id]
    dead = snapshot(backend, job_id)
    assert dead.state is JobState.DEAD
    assert dead.attempts == 1 and dead.stalls == MAX_STALLS
    assert f"{MAX_STALLS + 1} times" in dead.errors[-1]["message"]


@pytest.mark.needs("clock")
def test_a_started_attempt_after_stalls_is_counted_as_usual(backend: Backend) -> None:
    job_id = enqueue_one(backend, max_attempts=2)
    backend.claim("default", 1, worker_id="w1", lease_s=LEASE, now=T0, start=0)
    backend.reap(now=T0 + LEASE + 1)
    [job] = backend.claim("default", 1, worker_id="w1", lease_s=LEASE, now=T0 + 40)
    assert job.attempts == 1 and job.stalls == 1
    backend.reap(now=T0 + 40 + LEASE + 1)
    after = snapshot(backend, job_id)
    assert after.state is JobState.AVAILABLE
    assert (after.attempts, after.stalls) == (1, 1)


@pytest.mark.needs("clock")
def test_a_lost_claim_reply_is_given_back_by_its_claim_id(backend: Backend) -> None:
    ids = [enqueue_one(backend, max_attempts=1) for _ in range(4)]
    # Another worker's claim, which must not be touched.
    [other] = backend.claim("default", 1, worker_id="w2", lease_s=LEASE, now=T0)
    claim_id = "c0ffee" * 4
    # The claim lands in the store, and its reply is "lost": the caller only knows the id it sent.
    backend.claim("default", 3, worker_id="w1", lease_s=LEASE, now=T0 + 1, claim_id=claim_id)

    released = backend.release_claim("default", claim_id, now=T0 + 2)
    assert released == ids[1:]
    for job_id in released:
        job = snapshot(backend, job_id)
        assert job.state is JobState.AVAILABLE
        assert job.attempts == 0 and job.stalls == 0
    assert snapshot(backend, other.id).state is JobState.RUNNING
    assert backend.release_claim("default", claim_id, now=T0 + 3) == []  # idempotent
    assert backend.reap(now=T0 + 1 + LEASE + 1).dead == [other.id]


def test_claim_tokens_carry_the_claim_id(backend: Backend) -> None:
    for _ in range(2):
        enqueue_one(backend)
    claim_id = "ab" * 12
    jobs = backend.claim("default", 2, worker_id="w1", lease_s=LEASE, now=T0, claim_id=claim_id)
    tokens = [j.lease_token for j in jobs]
    assert all(t is not None and t.startswith(claim_id) for t in tokens)
    assert len(set(tokens)) == 2


@pytest.mark.parametrize("bad", ["", "xyz", "AB" * 12, "ab" * 13])
def test_a_claim_id_is_24_lowercase_hex_digits(backend: Backend, bad: str) -> None:
    enqueue_one(backend)
    with pytest.raises(ValueError):
        backend.claim("default", 1, worker_id="w1", lease_s=LEASE, now=T0, claim_id=bad)
