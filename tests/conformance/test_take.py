"""``Backend.take``: a store as a message broker's companion leases the job the broker
delivered, by id (see the method's contract in backends/base.py). Same rules on every store."""

from __future__ import annotations

import pytest
from support import T0, enqueue_one, new_job

from conveyor import JobState, LeaseLost
from conveyor.backends.base import Backend, ErrorInfo, Lease, new_claim_id

LEASE = 30.0


def token() -> str:
    return new_claim_id() + "1"


def take(backend: Backend, job_id: int, *, now: float = T0 + 1, worker: str = "w1",
         tok: str | None = None, lease_s: float = LEASE):
    return backend.take(job_id, tok or token(), worker_id=worker, lease_s=lease_s, now=now)


def test_take_leases_an_available_job(backend: Backend) -> None:
    job_id = enqueue_one(backend, args={"n": 1}, priority=3)
    tok = token()
    job = backend.take(job_id, tok, worker_id="w1", lease_s=LEASE, now=T0 + 1)
    assert job is not None
    assert job.id == job_id and job.state is JobState.RUNNING and job.attempts == 1
    assert job.lease_token == tok and job.worker_id == "w1"
    assert job.lease_expires_at == pytest.approx(T0 + 1 + LEASE)
    assert job.attempted_at == pytest.approx(T0 + 1)
    assert job.args == {"n": 1} and job.priority == 3 and job.errors == []
    stored = backend.get(job_id)
    assert stored is not None and stored.state is JobState.RUNNING
    assert stored.lease_token == tok
    # The lease works as a claim's does: heartbeat, then ack.
    assert backend.heartbeat([Lease(job_id, tok)], lease_s=LEASE, now=T0 + 2) == set()
    backend.ack(Lease(job_id, tok), '"done"', now=T0 + 3)
    done = backend.get(job_id)
    assert done is not None and done.state is JobState.SUCCEEDED and done.result == "done"


@pytest.mark.needs("lookup")
def test_take_ignores_run_at(backend: Backend) -> None:
    job_id = enqueue_one(backend, delay=3600)
    assert backend.get(job_id).state is JobState.SCHEDULED  # type: ignore[union-attr]
    job = take(backend, job_id)
    assert job is not None and job.state is JobState.RUNNING and job.attempts == 1


def test_take_again_fences_the_old_holder_and_records_the_lost_attempt(
        backend: Backend) -> None:
    job_id = enqueue_one(backend, max_attempts=5)
    old = token()
    assert take(backend, job_id, tok=old, worker="w1") is not None
    new = token()
    again = take(backend, job_id, tok=new, worker="w2", now=T0 + 5)
    assert again is not None and again.attempts == 2 and again.worker_id == "w2"
    assert [(e["attempt"], e["kind"], e["worker_id"]) for e in again.errors] == [
        (1, "lease_expired", "w1")]
    # The old holder is fenced everywhere.
    with pytest.raises(LeaseLost):
        backend.ack(Lease(job_id, old), None, now=T0 + 6)
    with pytest.raises(LeaseLost):
        backend.retry(Lease(job_id, old), ErrorInfo("exception", "late"), delay=0, now=T0 + 6)
    assert backend.heartbeat([Lease(job_id, old)], lease_s=LEASE, now=T0 + 6) == {job_id}
    backend.ack(Lease(job_id, new), None, now=T0 + 7)
    assert backend.get(job_id).state is JobState.SUCCEEDED  # type: ignore[union-attr]


@pytest.mark.parametrize("end", ["ack", "kill", "cancel"])
def test_take_refuses_a_finished_job(backend: Backend, end: str) -> None:
    job_id = enqueue_one(backend)
    tok = token()
    assert take(backend, job_id, tok=tok) is not None
    if end == "ack":
        backend.ack(Lease(job_id, tok), None, now=T0 + 2)
    elif end == "kill":
        backend.kill(Lease(job_id, tok), ErrorInfo("rejected", "no"), now=T0 + 2)
    else:
        assert backend.cancel(job_id, now=T0 + 2)
    before = backend.get(job_id)
    assert take(backend, job_id, now=T0 + 3) is None
    assert backend.get(job_id) == before  # nothing changed


def test_take_refuses_unknown_and_waiting_jobs(backend: Backend) -> None:
    assert take(backend, 987654321) is None
    parent = enqueue_one(backend)
    [child] = backend.enqueue_many([new_job(after=(parent,))], now=T0)
    assert backend.get(child.id).state is JobState.WAITING  # type: ignore[union-attr]
    assert take(backend, child.id) is None
    assert backend.get(child.id).state is JobState.WAITING  # type: ignore[union-attr]


def test_take_after_a_retry_counts_on(backend: Backend) -> None:
    job_id = enqueue_one(backend, max_attempts=3)
    tok = token()
    take(backend, job_id, tok=tok)
    state = backend.retry(Lease(job_id, tok), ErrorInfo("exception", "boom"), delay=10,
                          now=T0 + 2)
    assert state is JobState.SCHEDULED
    job = take(backend, job_id, now=T0 + 3)  # the broker delivered the retry early: taken
    assert job is not None and job.attempts == 2
    assert [e["kind"] for e in job.errors] == ["exception"]


def test_take_keeps_steps(backend: Backend) -> None:
    job_id = enqueue_one(backend)
    first = take(backend, job_id)
    assert first is not None
    backend.record_step(job_id, "charge", '"ch_1"', uid=first.uid)
    job = take(backend, job_id, now=T0 + 5)
    assert job is not None and job.steps == {"charge": "ch_1"}


def test_take_of_a_spent_job_makes_it_dead(backend: Backend) -> None:
    """Its last attempt's holder stopped answering: no attempt is left for the new delivery."""
    job_id = enqueue_one(backend, max_attempts=2)
    assert take(backend, job_id, worker="w1") is not None
    second = take(backend, job_id, worker="w2", now=T0 + 5)
    assert second is not None and second.attempts == 2
    assert take(backend, job_id, worker="w3", now=T0 + 9) is None
    dead = backend.get(job_id)
    assert dead is not None and dead.state is JobState.DEAD and dead.attempts == 2
    assert dead.lease_token is None and dead.finished_at == pytest.approx(T0 + 9)
    assert [(e["attempt"], e["kind"], e["worker_id"]) for e in dead.errors] == [
        (1, "lease_expired", "w1"), (2, "lease_expired", "w2")]
    assert "no attempts left" in dead.errors[-1]["message"]
    with pytest.raises(LeaseLost):
        backend.ack(Lease(job_id, second.lease_token or ""), None, now=T0 + 10)


def test_a_replaced_lease_counts_as_an_expiry(backend: Backend) -> None:
    """As reap counts each lease that ran out, per queue (QueueStats.lease_expiries)."""
    job_id = enqueue_one(backend, max_attempts=5, queue="q1")
    take(backend, job_id)
    take(backend, job_id, now=T0 + 2)
    take(backend, job_id, now=T0 + 3)
    stats = {q.queue: q for q in backend.stats(now=T0 + 4).queues}
    assert stats["q1"].lease_expiries == 2



def test_take_leaves_a_live_lease_given_for_the_same_message(backend: Backend) -> None:
    """SQS may hand one message to two receivers at once: the second delivery's take must not
    fence the first, which runs that very message. Once the lease has run out (its holder
    stopped answering) the same message takes it over as any delivery does; another
    message (a copy) takes it over at once."""
    job_id = enqueue_one(backend, max_attempts=5)
    first = token() + "mfeed"
    assert backend.take(job_id, first, worker_id="w1", lease_s=10, now=T0 + 1,
                        message="mfeed") is not None
    assert backend.take(job_id, token() + "mfeed", worker_id="w2", lease_s=LEASE, now=T0 + 5,
                        message="mfeed") is None
    kept = backend.get(job_id)
    assert kept is not None and kept.state is JobState.RUNNING
    assert kept.lease_token == first and kept.attempts == 1 and kept.errors == []
    assert backend.heartbeat([Lease(job_id, first)], lease_s=10, now=T0 + 6) == set()
    # Another message's delivery takes over a live lease, as before.
    other = token() + "mbeef"
    again = backend.take(job_id, other, worker_id="w2", lease_s=10, now=T0 + 7,
                         message="mbeef")
    assert again is not None and again.attempts == 2 and again.lease_token == other
    # Its lease runs out (at T0 + 17): a delivery of its own message then takes over.
    late = token() + "mbeef"
    last = backend.take(job_id, late, worker_id="w3", lease_s=LEASE, now=T0 + 18,
                        message="mbeef")
    assert last is not None and last.attempts == 3 and last.lease_token == late
    with pytest.raises(LeaseLost):
        backend.ack(Lease(job_id, first), None, now=T0 + 19)
    backend.ack(Lease(job_id, late), None, now=T0 + 19)
    assert backend.get(job_id).state is JobState.SUCCEEDED  # type: ignore[union-attr]
