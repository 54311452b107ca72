"""Backend.ready_queues: which of a worker's queues hold a job a claim could take now. A worker
on many queues asks it once per claim round and claims only there (worker/claimer.py), instead
of a store call per queue until one has work: on 3,000 queues that walk made an idle worker's
pick-up take 440 ms."""

from __future__ import annotations

import time

import pytest
from support import T0, new_job, running_worker, wait_for_job

from conveyor import Conveyor, JobState
from conveyor.backends.base import Backend

pytestmark = pytest.mark.needs("pause")  # a store's claims choose the queue (not a broker's)


def test_only_queues_with_a_job_to_claim_now_in_the_order_asked(backend: Backend) -> None:
    now = time.time()
    backend.enqueue_many([new_job(queue="avail")])
    backend.enqueue_many([new_job(queue="later", delay=3600)], now=now)
    backend.enqueue_many([new_job(queue="due", delay=5)], now=T0)  # scheduled, due long ago
    backend.enqueue_many([new_job(queue="paused")])
    assert backend.pause_queue("paused")
    backend.enqueue_many([new_job(queue="taken")])
    assert backend.claim("taken", 1, worker_id="w", lease_s=60)  # running: nothing to claim
    asked = ["empty", "due", "taken", "avail", "later", "paused"]
    assert backend.ready_queues(asked) == ["due", "avail"]
    assert backend.ready_queues(list(reversed(asked))) == ["avail", "due"]
    assert backend.ready_queues([]) == []
    assert backend.resume_queue("paused")
    assert backend.ready_queues(asked) == ["due", "avail", "paused"]


def test_a_worker_on_many_queues_claims_from_the_one_with_work(
        app: Conveyor, monkeypatch: pytest.MonkeyPatch) -> None:
    """A round of claims over 300 queues makes a handful of store calls, not one per queue
    until it meets the queue with the job."""
    queues = [f"q{i}" for i in range(300)]

    @app.task(name="noted")
    def noted(x: int) -> int:
        return x

    backend = app.backend
    claims: list[str] = []
    claim, ack_and_claim = backend.claim, backend.ack_and_claim

    def counting_claim(queue: str, *a: object, **kw: object) -> object:
        claims.append(queue)
        return claim(queue, *a, **kw)  # type: ignore[arg-type]

    def counting_ack_and_claim(acks: object, queue: str, *a: object, **kw: object) -> object:
        claims.append(queue)
        return ack_and_claim(acks, queue, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(backend, "claim", counting_claim)
    monkeypatch.setattr(backend, "ack_and_claim", counting_ack_and_claim)
    jobs = [noted.options(queue=q).enqueue(i) for i, q in enumerate(("q7", "q150", "q299"))]
    with running_worker(app, queues=queues, concurrency=4, poll_interval=0.2):
        for job in jobs:
            assert wait_for_job(app, job.id, timeout=30).state is JobState.SUCCEEDED
        later = noted.options(queue="q42").enqueue(42)  # while idle
        assert wait_for_job(app, later.id, timeout=30).state is JobState.SUCCEEDED
    assert set(claims) <= {"q7", "q150", "q299", "q42"}, sorted(set(claims))[:10]


def test_a_backlog_is_claimed_without_a_look_every_round(
        app: Conveyor, monkeypatch: pytest.MonkeyPatch) -> None:
    """While rounds come back full, a round claims among the queues the last look found
    ready instead of looking again (claimer.READY_REUSE_S; here never expiring): a look per
    round was a round trip per round for nothing new."""
    import conveyor.worker.claimer as claimer

    monkeypatch.setattr(claimer, "READY_REUSE_S", 3600.0)
    queues = [f"q{i}" for i in range(8)]

    @app.task(name="quick")
    def quick(x: int) -> int:
        return x

    for q in queues:
        quick.options(queue=q).enqueue_many([(i,) for i in range(50)])
    backend = app.backend
    looks = []
    ready_queues = backend.ready_queues

    def counting(qs: list[str]) -> list[str]:
        looks.append(len(qs))
        return ready_queues(qs)

    monkeypatch.setattr(backend, "ready_queues", counting)
    with running_worker(app, queues=queues, concurrency=4, poll_interval=0.2):
        deadline = time.monotonic() + 60
        while sum(s.succeeded for s in backend.stats().queues) < 400:
            assert time.monotonic() < deadline, "the backlog was not drained in 60 s"
            time.sleep(0.05)
    # 400 jobs in rounds of at most 4: 100 rounds or more. A look is made when a round was
    # not full (a queue ran dry, the worker waited), a few dozen at most.
    assert len(looks) < 50, len(looks)


def test_a_queue_that_gets_work_during_a_backlog_is_claimed_before_it_drains(
        app: Conveyor) -> None:
    """Reusing the last look is bounded in time: a job in a queue that was empty is claimed
    while another queue's backlog is still draining."""
    queues = [f"q{i}" for i in range(8)]

    @app.task(name="slowish")
    def slowish(x: int) -> int:
        time.sleep(0.005)
        return x

    for k in range(0, 3000, 500):
        slowish.options(queue="q0").enqueue_many([(i,) for i in range(k, k + 500)])
    backend = app.backend

    def backlog() -> int:
        [q0] = [s for s in backend.stats().queues if s.queue == "q0"]
        return q0.available

    with running_worker(app, queues=queues, concurrency=4, poll_interval=0.2):
        deadline = time.monotonic() + 60
        while backlog() > 2900:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        late = slowish.options(queue="q5").enqueue(1)
        assert wait_for_job(app, late.id, timeout=60).state is JobState.SUCCEEDED
        assert backlog() > 0  # claimed while q0 still had work: not starved by the backlog
