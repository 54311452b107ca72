"""A companion store's record and the broker's message must not drift apart: an outcome the
store refuses because its lease ran out sends the message back (so the job runs again), and
``job.wait`` is woken by the store that keeps the records."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from brokerkit import Broker, wait_for, with_state
from support import running_worker, wait_for_job

from conveyor import Conveyor, JobState, LeaseLost, RetryPolicy
from conveyor.backends.base import Backend, NewJob
from conveyor.executor import current_job

pytestmark = with_state

BASE: dict[str, Any] = {"task": "t", "queue": "q", "args": "{}", "max_attempts": 3,
                        "timeout": 30.0}


@pytest.fixture
def app(broker: Broker) -> Iterator[Conveyor]:
    app = Conveyor(broker.url, state=broker.state, retry=RetryPolicy(base=0.01, cap=0.05))
    try:
        yield app
    finally:
        app.close()


def test_an_ack_refused_for_a_lapsed_store_lease_runs_the_job_again(
        app: Conveyor, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's heartbeats did not land while the broker kept the message (its own lease
    was extended): the record's lease ran out and the ack is refused. Settling the message
    then would leave the record ``running`` with nothing to deliver or reap it; it goes back to
    the broker instead, and the next take re-leases the record, counting the lost lease."""
    state = app.backend.state  # type: ignore[attr-defined]
    beat = state.heartbeat
    second = threading.Event()

    def heartbeat(leases: Any, **kw: Any) -> set[int]:
        if not second.is_set():
            raise ConnectionError("the store is away")
        return beat(leases, **kw)  # type: ignore[no-any-return]

    monkeypatch.setattr(state, "heartbeat", heartbeat)

    @app.task(name="slow", max_attempts=3)
    def slow() -> str:
        ctx = current_job()
        assert ctx is not None
        if ctx.job.attempts == 1:
            stored = app.backend.get(ctx.job.id)
            # Past the store's lease: nothing extends it meanwhile.
            wait_for(lambda: app.backend.state.now()  # type: ignore[attr-defined]
                     > (stored.lease_expires_at or 0) + 0.2)  # type: ignore[union-attr]
        else:
            second.set()
        return "done"

    job = slow.enqueue()
    with running_worker(app, visibility_timeout=1.0):
        done = wait_for_job(app, job.id, timeout=30)
    assert done.state is JobState.SUCCEEDED and done.result == "done"
    assert done.attempts == 2
    assert [e["kind"] for e in done.errors] == ["lease_expired"]


@pytest.mark.parametrize("how", ["ack", "kill", "retry", "heartbeat"])
def test_an_outcome_refused_for_a_lapsed_store_lease_gives_the_message_back(
        open_broker: Callable[[], Backend], how: str) -> None:
    from conveyor.backends.base import ErrorInfo, Lease

    backend = open_broker()
    backend.enqueue_many([NewJob(**BASE)])
    (job,) = wait_for(lambda: backend.claim("q", 1, worker_id="w1", lease_s=1))  # type: ignore[misc]
    lease = Lease(job.id, job.lease_token or "")
    # The store's lease runs out (a take of the same message leaves a live one alone).
    time.sleep(1.5)
    late = backend.now()
    if how == "heartbeat":  # the worker stops the job and writes no outcome
        assert backend.heartbeat([lease], lease_s=30, now=late) == {job.id}
    else:
        with pytest.raises(LeaseLost):
            if how == "ack":
                backend.ack(lease, None, now=late)
            elif how == "kill":
                backend.kill(lease, ErrorInfo("exception", "boom"), now=late)
            else:
                backend.retry(lease, ErrorInfo("exception", "boom"), delay=0, now=late)
    (again,) = wait_for(lambda: backend.claim("q", 1, worker_id="w2", lease_s=30))  # type: ignore[misc]
    assert again.id == job.id and again.attempts == 2
    assert [e["kind"] for e in again.errors] == ["lease_expired"]
    backend.ack(Lease(again.id, again.lease_token or ""), None)
    assert backend.get(job.id).state is JobState.SUCCEEDED  # type: ignore[union-attr]


def test_an_outcome_refused_because_the_job_was_cancelled_drops_the_message(
        open_broker: Callable[[], Backend]) -> None:
    from conveyor.backends.base import Lease

    backend = open_broker()
    backend.enqueue_many([NewJob(**BASE)])
    (job,) = wait_for(lambda: backend.claim("q", 1, worker_id="w1", lease_s=30))  # type: ignore[misc]
    assert backend.cancel(job.id)
    with pytest.raises(LeaseLost):
        backend.ack(Lease(job.id, job.lease_token or ""), None)
    (marker,) = backend.enqueue_many([NewJob(**BASE)])
    (got,) = wait_for(lambda: backend.claim("q", 1, worker_id="w2", lease_s=30))  # type: ignore[misc]
    assert got.id == marker.id  # the cancelled job's message was settled, not given back
    assert backend.get(job.id).state is JobState.CANCELLED  # type: ignore[union-attr]


def test_a_waiter_is_woken_by_the_store_when_the_record_finishes(
        open_broker: Callable[[], Backend], monkeypatch: pytest.MonkeyPatch) -> None:
    """``job.wait`` on a companion waits on the store's wake-ups (a notification, a pub/sub
    message, an in-process signal), not only on polls: here the polls are an hour apart."""
    from conveyor.backends.base import Lease

    backend = open_broker()
    state: Backend = backend.state  # type: ignore[attr-defined]
    for b in (backend, state):
        monkeypatch.setattr(b, "finish_poll", (3600.0, 3600.0))
    backend.enqueue_many([NewJob(**BASE)])
    (job,) = wait_for(lambda: backend.claim("q", 1, worker_id="w1", lease_s=30))  # type: ignore[misc]
    looks = []
    get = state.get

    def counted(job_id: int) -> Any:
        looks.append(job_id)
        return get(job_id)

    monkeypatch.setattr(state, "get", counted)
    seen: list[Any] = []
    waiter = threading.Thread(target=lambda: seen.append(backend.wait_finished(job.id, math.inf)),
                              daemon=True)
    waiter.start()
    wait_for(lambda: len(looks) >= 2)  # its first look, and the one inside the watch
    backend.ack(Lease(job.id, job.lease_token or ""), '"ok"')
    waiter.join(timeout=30)
    assert not waiter.is_alive(), "the waiter slept through the finish"
    (done,) = seen
    assert done is not None and done.state is JobState.SUCCEEDED


@pytest.mark.parametrize("how", ["ack", "ack_many"])
def test_a_recorded_outcome_stands_when_the_broker_cannot_settle_its_message(
        open_broker: Callable[[], Backend], monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """The record is written, the settle fails (the broker is cut off): the outcome stands,
    and the call does not raise. Raised, the worker wrote the ack again, found its lease gone
    with the first one, and logged a recorded success as discarded ("the job is re-run")."""
    from conveyor.backends.base import Lease
    from conveyor.errors import StoreUnavailable

    backend = open_broker()
    backend.enqueue_many([NewJob(**BASE)])
    (job,) = wait_for(lambda: backend.claim("q", 1, worker_id="w1", lease_s=30))  # type: ignore[misc]

    def settle(deliveries: Any) -> list[bool]:
        raise StoreUnavailable("the broker is cut off")

    monkeypatch.setattr(backend.transport, "settle", settle)  # type: ignore[attr-defined]
    lease = Lease(job.id, job.lease_token or "")
    if how == "ack":
        backend.ack(lease, '"ok"')
    else:
        assert backend.ack_many([(lease, '"ok"')]) == [True]
    assert backend.get(job.id).state is JobState.SUCCEEDED  # type: ignore[union-attr]


def test_a_claim_that_fails_after_its_acks_says_which_acks_were_written(
        open_broker: Callable[[], Backend], monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker's ack_and_claim writes the acks, then claims: a claim that fails after them
    raises ClaimLost with the acks' answers, so the worker settles them instead of writing
    them again (each refused then, its lease gone with the first write, and logged as a
    success discarded)."""
    from conveyor.backends.base import Lease
    from conveyor.errors import ClaimLost, StoreUnavailable

    backend = open_broker()
    backend.enqueue_many([NewJob(**BASE)])
    (job,) = wait_for(lambda: backend.claim("q", 1, worker_id="w1", lease_s=30))  # type: ignore[misc]

    def claim(*args: Any, **kw: Any) -> list[Any]:
        raise StoreUnavailable("the broker is cut off")

    monkeypatch.setattr(backend, "claim", claim)
    with pytest.raises(ClaimLost) as lost:
        backend.ack_and_claim([(Lease(job.id, job.lease_token or ""), '"ok"')], "q", 1,
                              worker_id="w1", lease_s=30)
    assert lost.value.acks_held == [True]
    assert backend.get(job.id).state is JobState.SUCCEEDED  # type: ignore[union-attr]
