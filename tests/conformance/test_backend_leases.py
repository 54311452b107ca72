"""Backend contract: leases, fencing, ack/retry/kill/release, heartbeat and the reaper."""

from __future__ import annotations

import json

import pytest
from support import T0, enqueue_one

from conveyor import JobState, LeaseLost
from conveyor.backends.base import Backend, ErrorInfo, Lease
from conveyor.job import Job

LEASE = 30.0


def claim_one(
    backend: Backend, *, now: float = T0, worker_id: str = "w1", queue: str = "default"
) -> Job:
    [job] = backend.claim(queue, 1, worker_id=worker_id, lease_s=LEASE, now=now)
    return job


def lease_of(job: Job) -> Lease:
    assert job.lease_token is not None
    return Lease(job.id, job.lease_token)


def snapshot(backend: Backend, job_id: int) -> Job:
    job = backend.get(job_id)
    assert job is not None
    return job


def err(message: str = "boom", kind: str = "exception") -> ErrorInfo:
    return ErrorInfo(kind=kind, message=message, type="ValueError", traceback="Traceback...")


def assert_all_refused(backend: Backend, lease: Lease, *, now: float) -> None:
    """ack, retry and kill with this lease all raise LeaseLost and change nothing."""
    before = snapshot(backend, lease.job_id)
    with pytest.raises(LeaseLost) as info:
        backend.ack(lease, json.dumps("zombie"), now=now)
    assert info.value.job_id == lease.job_id
    assert snapshot(backend, lease.job_id) == before
    with pytest.raises(LeaseLost):
        backend.retry(lease, err("zombie retry"), delay=0, now=now)
    assert snapshot(backend, lease.job_id) == before
    with pytest.raises(LeaseLost):
        backend.kill(lease, err("zombie kill"), now=now)
    assert snapshot(backend, lease.job_id) == before


# -- ack ----------------------------------------------------------------------------------


@pytest.mark.needs("lookup")
def test_ack_stores_the_result_and_finishes_the_job(backend: Backend) -> None:
    enqueue_one(backend)
    job = claim_one(backend)
    backend.ack(lease_of(job), json.dumps({"sent": True, "n": [1, 2]}), now=T0 + 3)

    done = snapshot(backend, job.id)
    assert done.state is JobState.SUCCEEDED
    assert done.result == {"sent": True, "n": [1, 2]}
    assert done.finished_at == T0 + 3
    assert done.attempts == 1
    assert done.lease_token is None
    assert done.lease_expires_at is None
    assert done.errors == []


@pytest.mark.needs("lookup")
def test_ack_with_no_result_stores_none(backend: Backend) -> None:
    enqueue_one(backend)
    job = claim_one(backend)
    backend.ack(lease_of(job), None, now=T0 + 1)
    done = snapshot(backend, job.id)
    assert done.state is JobState.SUCCEEDED
    assert done.result is None


@pytest.mark.needs("lookup")
def test_a_second_ack_is_refused(backend: Backend) -> None:
    enqueue_one(backend)
    job = claim_one(backend)
    backend.ack(lease_of(job), json.dumps(1), now=T0 + 1)
    assert_all_refused(backend, lease_of(job), now=T0 + 2)
    assert snapshot(backend, job.id).result == 1


# -- fencing ----------------------------------------------------------------------------------


@pytest.mark.needs("lookup")
def test_wrong_token_is_refused_and_changes_nothing(backend: Backend) -> None:
    enqueue_one(backend)
    job = claim_one(backend)
    assert_all_refused(backend, Lease(job.id, "0" * 32), now=T0 + 1)
    assert snapshot(backend, job.id).state is JobState.RUNNING
    # The real lease still works afterwards.
    backend.ack(lease_of(job), json.dumps("ok"), now=T0 + 2)
    assert snapshot(backend, job.id).result == "ok"


@pytest.mark.needs("lookup")
def test_lease_on_a_missing_job_is_refused(backend: Backend) -> None:
    job_id = enqueue_one(backend)
    ghost = Lease(job_id + 1000, "f" * 32)
    with pytest.raises(LeaseLost):
        backend.ack(ghost, None, now=T0)
    with pytest.raises(LeaseLost):
        backend.retry(ghost, err(), delay=0, now=T0)
    with pytest.raises(LeaseLost):
        backend.kill(ghost, err(), now=T0)
    assert backend.get(job_id + 1000) is None
    assert snapshot(backend, job_id).state is JobState.AVAILABLE


@pytest.mark.needs("clock", "lookup")
def test_stale_token_from_an_earlier_attempt_is_refused(backend: Backend) -> None:
    enqueue_one(backend, max_attempts=3)
    first = claim_one(backend, now=T0)
    assert backend.retry(lease_of(first), err(), delay=0, now=T0 + 1) is JobState.AVAILABLE
    second = claim_one(backend, now=T0 + 2)
    assert second.id == first.id and second.attempts == 2

    assert_all_refused(backend, lease_of(first), now=T0 + 3)
    assert backend.heartbeat([lease_of(first)], lease_s=LEASE, now=T0 + 3) == {first.id}
    assert snapshot(backend, first.id).lease_expires_at == T0 + 2 + LEASE


@pytest.mark.needs("clock")
def test_after_lease_expiry_ack_retry_kill_are_refused(backend: Backend) -> None:
    enqueue_one(backend, max_attempts=3)
    job = claim_one(backend, now=T0)
    assert job.lease_expires_at == T0 + LEASE
    # Not reaped yet, but the lease is over: a late worker must not complete the job.
    assert_all_refused(backend, lease_of(job), now=T0 + LEASE + 0.5)
    assert snapshot(backend, job.id).state is JobState.RUNNING


@pytest.mark.needs("lookup")
def test_ack_just_before_expiry_is_accepted(backend: Backend) -> None:
    enqueue_one(backend)
    job = claim_one(backend, now=T0)
    backend.ack(lease_of(job), json.dumps("in time"), now=T0 + LEASE - 0.5)
    assert snapshot(backend, job.id).state is JobState.SUCCEEDED


# -- heartbeat --------------------------------------------------------------------------------


@pytest.mark.needs("clock", "lookup")
def test_heartbeat_extends_only_matching_leases_and_reports_lost_ids(backend: Backend) -> None:
    for _ in range(3):
        enqueue_one(backend)
    a, b, c = backend.claim("default", 3, worker_id="w", lease_s=LEASE, now=T0)
    ghost = Lease(c.id + 1000, "a" * 32)

    lost = backend.heartbeat([lease_of(a), Lease(b.id, "b" * 32), ghost], lease_s=60, now=T0 + 10)

    assert lost == {b.id, ghost.job_id}
    assert snapshot(backend, a.id).lease_expires_at == T0 + 10 + 60
    assert snapshot(backend, b.id).lease_expires_at == T0 + LEASE  # untouched
    assert snapshot(backend, c.id).lease_expires_at == T0 + LEASE  # not in the list
    assert backend.heartbeat([], lease_s=60, now=T0 + 10) == set()


@pytest.mark.needs("lookup")
def test_heartbeat_keeps_a_lease_alive_past_its_first_expiry(backend: Backend) -> None:
    enqueue_one(backend)
    job = claim_one(backend, now=T0)
    assert backend.heartbeat([lease_of(job)], lease_s=LEASE, now=T0 + 20) == set()
    # Past the original expiry but inside the extended one.
    assert backend.reap(now=T0 + LEASE + 5).count == 0
    backend.ack(lease_of(job), json.dumps("late but leased"), now=T0 + LEASE + 5)
    assert snapshot(backend, job.id).state is JobState.SUCCEEDED


@pytest.mark.needs("clock")
def test_heartbeat_after_expiry_reports_the_lease_lost(backend: Backend) -> None:
    enqueue_one(backend)
    job = claim_one(backend, now=T0)
    assert backend.heartbeat([lease_of(job)], lease_s=LEASE, now=T0 + LEASE + 1) == {job.id}
    assert snapshot(backend, job.id).lease_expires_at == T0 + LEASE


# -- reaper -----------------------------------------------------------------------------------


def lease_expiries(backend: Backend, queue: str, now: float) -> int:
    for q in backend.stats(now=now).queues:
        if q.queue == queue:
            return q.lease_expiries
    return 0


@pytest.mark.needs("clock", "lookup")
def test_reap_requeues_expired_leases_and_counts_them(backend: Backend) -> None:
    enqueue_one(backend, max_attempts=3)
    job = claim_one(backend, now=T0, worker_id="w-crashed")
    assert lease_expiries(backend, "default", T0) == 0

    assert backend.reap(now=T0 + LEASE - 1).count == 0
    assert snapshot(backend, job.id).state is JobState.RUNNING

    result = backend.reap(now=T0 + LEASE + 1)
    assert result.requeued == [job.id]
    assert result.dead == []
    reaped = snapshot(backend, job.id)
    assert reaped.state is JobState.AVAILABLE
    assert reaped.attempts == 1  # the lost attempt counts
    assert reaped.lease_token is None and reaped.lease_expires_at is None
    assert reaped.finished_at is None
    [error] = reaped.errors
    assert error["kind"] == "lease_expired"
    assert error["attempt"] == 1
    assert error["at"] == T0 + LEASE + 1
    assert lease_expiries(backend, "default", T0 + LEASE + 1) == 1

    # Idempotent: nothing more to reap, the counter does not move.
    assert backend.reap(now=T0 + LEASE + 2).count == 0
    assert lease_expiries(backend, "default", T0 + LEASE + 2) == 1


def expired_leases(backend: Backend, queue: str, now: float) -> int:
    return sum(q.expired_leases for q in backend.stats(now=now).queues if q.queue == queue)


@pytest.mark.needs("clock")
def test_stats_count_running_jobs_past_their_lease_until_reaped(backend: Backend) -> None:
    """The gauge an operator watches for crashed or stalled workers: running jobs whose lease
    ran out and that no reaper took back yet. A heartbeat moves a job out of it."""
    for _ in range(3):
        enqueue_one(backend, max_attempts=3)
    enqueue_one(backend, queue="other")
    a, b, c = backend.claim("default", 3, worker_id="w", lease_s=LEASE, now=T0)
    backend.claim("other", 1, worker_id="w", lease_s=2 * LEASE, now=T0)
    assert expired_leases(backend, "default", T0 + LEASE - 1) == 0
    assert expired_leases(backend, "default", T0 + LEASE) == 0  # expires *after* lease_expires_at
    assert expired_leases(backend, "default", T0 + LEASE + 1) == 3
    assert expired_leases(backend, "other", T0 + LEASE + 1) == 0
    assert backend.heartbeat([lease_of(a)], lease_s=LEASE, now=T0 + LEASE - 1) == set()  # none lost
    assert expired_leases(backend, "default", T0 + LEASE + 1) == 2
    backend.reap(now=T0 + LEASE + 1)
    assert expired_leases(backend, "default", T0 + LEASE + 1) == 0
    assert lease_expiries(backend, "default", T0 + LEASE + 1) == 2
    assert expired_leases(backend, "default", T0 + 2 * LEASE) == 1  # a's new lease ran out too
    assert {b.id, c.id} <= {j.id for j in backend.claim("default", 3, worker_id="w2", lease_s=LEASE,
                                                         now=T0 + LEASE + 2)}


@pytest.mark.needs("clock")
def test_reap_at_max_attempts_sends_the_job_dead(backend: Backend) -> None:
    enqueue_one(backend, max_attempts=1, queue="q1")
    job = claim_one(backend, now=T0, queue="q1")
    result = backend.reap(now=T0 + LEASE + 1)
    assert result.dead == [job.id]
    assert result.requeued == []
    dead = snapshot(backend, job.id)
    assert dead.state is JobState.DEAD
    assert dead.finished_at == T0 + LEASE + 1
    assert dead.lease_token is None
    assert [e["kind"] for e in dead.errors] == ["lease_expired"]
    assert lease_expiries(backend, "q1", T0 + LEASE + 1) == 1
    assert backend.claim("q1", 1, worker_id="w", lease_s=LEASE, now=T0 + LEASE + 2) == []


@pytest.mark.needs("clock")
def test_reap_is_bounded_by_limit_and_counts_per_queue(backend: Backend) -> None:
    for q in ("a", "a", "b"):
        enqueue_one(backend, queue=q)
    backend.claim("a", 2, worker_id="w", lease_s=LEASE, now=T0)
    backend.claim("b", 1, worker_id="w", lease_s=LEASE, now=T0)

    assert backend.reap(limit=2, now=T0 + LEASE + 1).count == 2
    assert backend.reap(limit=2, now=T0 + LEASE + 1).count == 1
    assert backend.reap(limit=2, now=T0 + LEASE + 1).count == 0
    assert lease_expiries(backend, "a", T0 + LEASE + 1) == 2
    assert lease_expiries(backend, "b", T0 + LEASE + 1) == 1


@pytest.mark.needs("clock")
def test_zombie_worker_is_fenced_off_after_its_job_moves_on(backend: Backend) -> None:
    enqueue_one(backend, max_attempts=3)
    a = claim_one(backend, now=T0, worker_id="A")
    assert backend.reap(now=T0 + LEASE + 1).requeued == [a.id]
    b = claim_one(backend, now=T0 + LEASE + 2, worker_id="B")
    assert b.id == a.id
    assert b.attempts == 2
    assert b.lease_token != a.lease_token

    # A wakes up and tries everything; all refused, nothing changes.
    now = T0 + LEASE + 3
    assert backend.heartbeat([lease_of(a)], lease_s=LEASE, now=now) == {a.id}
    assert_all_refused(backend, lease_of(a), now=now)
    assert backend.release([lease_of(a)], now=now) == []
    assert snapshot(backend, a.id).lease_token == b.lease_token

    backend.ack(lease_of(b), json.dumps("from B"), now=now + 1)
    done = snapshot(backend, b.id)
    assert done.state is JobState.SUCCEEDED
    assert done.result == "from B"
    assert done.worker_id == "B"
    assert done.attempts == 2
    # A's late result can still not overwrite B's.
    assert_all_refused(backend, lease_of(a), now=now + 2)
    assert snapshot(backend, b.id).result == "from B"


# -- retry / kill -------------------------------------------------------------------------------


@pytest.mark.needs("lookup")
def test_retry_without_delay_makes_the_job_available_now(backend: Backend) -> None:
    enqueue_one(backend, max_attempts=3)
    job = claim_one(backend, now=T0)
    state = backend.retry(lease_of(job), err("first failure"), delay=0, now=T0 + 5)
    assert state is JobState.AVAILABLE

    after = snapshot(backend, job.id)
    assert after.state is JobState.AVAILABLE
    assert after.run_at == T0 + 5
    assert after.attempts == 1
    assert after.lease_token is None and after.lease_expires_at is None
    assert after.finished_at is None
    [e] = after.errors
    assert (e["attempt"], e["kind"], e["message"], e["type"]) == (
        1,
        "exception",
        "first failure",
        "ValueError",
    )
    assert e["at"] == T0 + 5
    assert e["worker_id"] == "w1"
    again = claim_one(backend, now=T0 + 5)
    assert again.id == job.id and again.attempts == 2


@pytest.mark.needs("clock", "lookup")
def test_retry_with_delay_schedules_the_job(backend: Backend) -> None:
    enqueue_one(backend, max_attempts=3)
    job = claim_one(backend, now=T0)
    assert backend.retry(lease_of(job), err(), delay=10, now=T0 + 5) is JobState.SCHEDULED
    after = snapshot(backend, job.id)
    assert after.state is JobState.SCHEDULED
    assert after.run_at == T0 + 15

    assert backend.claim("default", 1, worker_id="w", lease_s=LEASE, now=T0 + 14.9) == []
    again = claim_one(backend, now=T0 + 15)
    assert again.id == job.id and again.attempts == 2


@pytest.mark.needs("lookup")
def test_retry_at_the_last_attempt_goes_dead(backend: Backend) -> None:
    enqueue_one(backend, max_attempts=2)
    first = claim_one(backend, now=T0)
    assert backend.retry(lease_of(first), err("one"), delay=0, now=T0 + 1) is JobState.AVAILABLE
    second = claim_one(backend, now=T0 + 2)
    assert backend.retry(lease_of(second), err("two"), delay=5, now=T0 + 3) is JobState.DEAD

    dead = snapshot(backend, first.id)
    assert dead.state is JobState.DEAD
    assert dead.finished_at == T0 + 3
    assert dead.attempts == 2
    assert dead.lease_token is None
    assert [(e["attempt"], e["message"]) for e in dead.errors] == [(1, "one"), (2, "two")]
    assert backend.claim("default", 1, worker_id="w", lease_s=LEASE, now=T0 + 100) == []


@pytest.mark.needs("clock")
def test_errors_accumulate_with_attempt_numbers(backend: Backend) -> None:
    enqueue_one(backend, max_attempts=4)
    kinds = ["exception", "timeout", "retry", "lease_expired"]
    for attempt in range(1, 4):
        job = claim_one(backend, now=T0 + attempt * 10, worker_id=f"w{attempt}")
        assert job.attempts == attempt
        backend.retry(
            lease_of(job),
            err(f"failure {attempt}", kinds[attempt - 1]),
            delay=0,
            now=T0 + attempt * 10 + 1,
        )
    job = claim_one(backend, now=T0 + 40, worker_id="w4")
    assert backend.reap(now=T0 + 40 + LEASE + 1).dead == [job.id]

    dead = snapshot(backend, job.id)
    assert dead.state is JobState.DEAD
    assert [e["attempt"] for e in dead.errors] == [1, 2, 3, 4]
    assert [e["kind"] for e in dead.errors] == kinds
    assert [e["worker_id"] for e in dead.errors] == ["w1", "w2", "w3", "w4"]
    assert [e["message"] for e in dead.errors[:3]] == ["failure 1", "failure 2", "failure 3"]
    assert dead.last_error == dead.errors[-1]


@pytest.mark.needs("clock")
def test_a_claimed_job_carries_the_errors_of_its_earlier_attempts(backend: Backend) -> None:
    # A claim reads a job's error records only when it can have some (a store may skip the
    # read on a first attempt): after a failure, an expired lease, a release and a redrive.
    enqueue_one(backend, max_attempts=3)
    first = claim_one(backend, now=T0 + 1)
    assert first.errors == []
    backend.retry(lease_of(first), err("failure 1"), delay=0, now=T0 + 2)
    second = claim_one(backend, now=T0 + 3, worker_id="w2")
    assert [e["message"] for e in second.errors] == ["failure 1"]
    assert backend.release([lease_of(second)], now=T0 + 4) == [second.id]
    again = claim_one(backend, now=T0 + 5, worker_id="w3")
    assert again.attempts == 2
    assert [e["message"] for e in again.errors] == ["failure 1"]
    backend.reap(now=T0 + 5 + LEASE + 1)
    third = claim_one(backend, now=T0 + 40, worker_id="w4")
    assert [e["kind"] for e in third.errors] == ["exception", "lease_expired"]
    backend.kill(lease_of(third), err("for good"), now=T0 + 41)
    assert backend.redrive([third.id], now=T0 + 42) == 1
    revived = claim_one(backend, now=T0 + 43, worker_id="w5")
    assert revived.attempts == 1
    assert [e["message"] for e in revived.errors][-1] == "for good"
    assert len(revived.errors) == 3


@pytest.mark.needs("lookup")
def test_kill_sends_the_job_dead_at_once(backend: Backend) -> None:
    enqueue_one(backend, max_attempts=5)
    job = claim_one(backend, now=T0)
    backend.kill(lease_of(job), err("bad input", "rejected"), now=T0 + 2)
    dead = snapshot(backend, job.id)
    assert dead.state is JobState.DEAD
    assert dead.finished_at == T0 + 2
    assert dead.attempts == 1
    assert dead.lease_token is None and dead.lease_expires_at is None
    [e] = dead.errors
    assert (e["attempt"], e["kind"], e["message"]) == (1, "rejected", "bad input")


# -- release ------------------------------------------------------------------------------------


@pytest.mark.needs("lookup")
def test_release_gives_jobs_back_without_counting_the_attempt(backend: Backend) -> None:
    for _ in range(2):
        enqueue_one(backend, max_attempts=1)
    a, b = backend.claim("default", 2, worker_id="w", lease_s=LEASE, now=T0)
    stale = Lease(b.id, "c" * 32)

    released = backend.release([lease_of(a), stale], now=T0 + 1)

    assert released == [a.id]
    after = snapshot(backend, a.id)
    assert after.state is JobState.AVAILABLE
    assert after.attempts == 0
    assert after.lease_token is None and after.lease_expires_at is None
    assert after.worker_id is None
    assert after.errors == []
    assert snapshot(backend, b.id).state is JobState.RUNNING  # the stale lease was skipped
    # The old lease is stale now: releasing again does nothing.
    assert backend.release([lease_of(a)], now=T0 + 2) == []
    assert backend.release([], now=T0 + 2) == []
    # Even with max_attempts=1 the job can still run: the released attempt did not count.
    again = claim_one(backend, now=T0 + 3)
    assert again.id == a.id and again.attempts == 1


@pytest.mark.needs("lookup")
def test_release_skips_finished_jobs(backend: Backend) -> None:
    enqueue_one(backend)
    job = claim_one(backend, now=T0)
    backend.ack(lease_of(job), json.dumps("done"), now=T0 + 1)
    assert backend.release([lease_of(job)], now=T0 + 2) == []
    assert snapshot(backend, job.id).state is JobState.SUCCEEDED


@pytest.mark.needs("clock", "lookup")
def test_ack_many_acks_the_held_leases_and_refuses_the_stale(backend: Backend) -> None:
    for _ in range(3):
        enqueue_one(backend, now=T0)
    a, b, c = backend.claim("default", 3, worker_id="w", lease_s=30, now=T0)
    stale = Lease(b.id, "not-the-token")
    assert backend.ack_many([(Lease(a.id, a.lease_token or ""), '"A"'), (stale, '"B"'),
                             (Lease(c.id, c.lease_token or ""), None)], now=T0 + 1) == [True, False, True]
    assert backend.get(a.id).state is JobState.SUCCEEDED and backend.get(a.id).result == "A"
    assert backend.get(c.id).state is JobState.SUCCEEDED and backend.get(c.id).result is None
    assert backend.get(b.id).state is JobState.RUNNING  # the refused ack changed nothing
    assert backend.ack_many([], now=T0 + 1) == []
    # An expired lease is refused too.
    assert backend.ack_many([(Lease(b.id, b.lease_token or ""), None)], now=T0 + 31) == [False]
