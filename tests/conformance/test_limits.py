"""Concurrency and rate limits, enforced by the store's claim on every backend: across
workers and queues, with held-back jobs waiting without burning attempts."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import replace

import pytest
from support import T0, enqueue_one, new_job, running_worker, wait_for_job

from conveyor import Conveyor
from conveyor.backends.base import Backend, ErrorInfo, Lease, NewJob
from conveyor.job import Job, JobState

pytestmark = pytest.mark.needs("limits")  # a broker chooses which job runs: no limits


def limited(key: str = "K", limit: int = 2, queue: str = "default") -> NewJob:
    return replace(new_job(queue=queue), concurrency_key=key, concurrency_limit=limit)


def rated(key: str = "R", limit: int = 3, period: float = 60.0) -> NewJob:
    return replace(new_job(), rate_key=key, rate_limit=limit, rate_period=period)


def claim(backend: Backend, n: int, now: float = T0, queue: str = "default") -> list[Job]:
    return backend.claim(queue, n, worker_id="w", lease_s=30, now=now)


def lease(job: Job) -> Lease:
    assert job.lease_token is not None
    return Lease(job.id, job.lease_token)


# -- concurrency ----------------------------------------------------------------------------------

def test_a_key_at_its_limit_is_passed_over_for_the_jobs_behind(backend: Backend) -> None:
    gated = [r.id for r in backend.enqueue_many([limited()] * 5, now=T0)]
    plain = [enqueue_one(backend) for _ in range(3)]
    got = [j.id for j in claim(backend, 10)]
    assert got == gated[:2] + plain
    assert claim(backend, 10) == []
    for job_id in gated[2:]:
        job = backend.get(job_id)
        assert job is not None and job.state is JobState.AVAILABLE and job.attempts == 0


def test_every_way_out_of_running_frees_a_slot(backend: Backend) -> None:
    ids = [r.id for r in backend.enqueue_many([limited(limit=1)] * 6, now=T0)]
    [a] = claim(backend, 5)
    backend.ack(lease(a), None, now=T0)
    [b] = claim(backend, 5)
    assert (a.id, b.id) == (ids[0], ids[1])  # the oldest held-back job comes next
    backend.retry(lease(b), ErrorInfo("exception", "x"), delay=100, now=T0)
    [c] = claim(backend, 5)
    backend.kill(lease(c), ErrorInfo("rejected", "x"), now=T0)
    [d] = claim(backend, 5)
    backend.release([lease(d)], now=T0)
    [e] = claim(backend, 5)
    assert e.id == d.id
    assert backend.cancel(e.id, now=T0)
    [f] = claim(backend, 5)
    assert claim(backend, 5, now=T0 + 10) == []
    backend.reap(now=T0 + 31)  # f's lease expired: back to available, the slot is free
    [g] = claim(backend, 5, now=T0 + 32)
    assert g.id == f.id and g.attempts == 2


@pytest.mark.needs("cross_queue")
def test_the_limit_holds_across_queues(backend: Backend) -> None:
    backend.enqueue_many([limited(limit=1, queue="q1")] * 2, now=T0)
    backend.enqueue_many([limited(limit=1, queue="q2")] * 2, now=T0)
    assert len(claim(backend, 5, queue="q1")) == 1
    assert claim(backend, 5, queue="q2") == []


@pytest.mark.needs("cross_queue")
def test_a_slot_freed_in_another_queue_lets_a_held_back_queue_claim_at_once(backend: Backend) -> None:
    backend.enqueue_many([limited(limit=1, queue="q1")], now=T0)
    backend.enqueue_many([limited(limit=1, queue="q2")] * 2, now=T0)
    [a] = claim(backend, 5, queue="q1")
    for k in range(3):
        assert claim(backend, 5, queue="q2", now=T0 + k / 10) == []
    backend.ack(lease(a), None, now=T0 + 0.3)
    assert len(claim(backend, 5, queue="q2", now=T0 + 0.4)) == 1


def test_keys_are_independent(backend: Backend) -> None:
    backend.enqueue_many([limited("a", 1)] * 3 + [limited("b", 2)] * 3, now=T0)
    keys = sorted(j.concurrency_key or "" for j in claim(backend, 10))
    assert keys == ["a", "b", "b"]


def test_racing_claimers_never_exceed_the_limit(backend: Backend) -> None:
    backend.enqueue_many([limited(limit=3)] * 60 + [new_job()] * 20, now=T0)
    barrier = threading.Barrier(8)
    got: list[Job] = []
    lock = threading.Lock()

    def run() -> None:
        barrier.wait()
        for _ in range(5):
            jobs = claim(backend, 4)
            with lock:
                got.extend(jobs)

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    gated = [j for j in got if j.concurrency_key == "K"]
    assert len(gated) == 3
    assert len(got) == 23 and len({j.id for j in got}) == 23


# -- rate -----------------------------------------------------------------------------------------

def test_a_rate_limit_is_a_sliding_window_of_claims(backend: Backend) -> None:
    ids = [r.id for r in backend.enqueue_many([rated()] * 10, now=T0)]
    assert [j.id for j in claim(backend, 10, now=T0)] == ids[:3]
    assert claim(backend, 10, now=T0 + 30) == []
    assert claim(backend, 10, now=T0 + 59.9) == []
    assert [j.id for j in claim(backend, 10, now=T0 + 60)] == ids[3:6]
    held = backend.get(ids[9])
    assert held is not None and held.attempts == 0 and held.state is JobState.AVAILABLE


def test_each_attempt_counts_against_the_rate(backend: Backend) -> None:
    ids = [r.id for r in backend.enqueue_many([rated(limit=2)] * 3, now=T0)]
    first, _second = claim(backend, 5, now=T0)
    backend.retry(lease(first), ErrorInfo("exception", "x"), delay=0, now=T0 + 1)
    assert claim(backend, 5, now=T0 + 2) == []  # two claims already in this window
    again = claim(backend, 5, now=T0 + 60.5)
    assert sorted(j.id for j in again) == [first.id, ids[2]]


def test_racing_claimers_never_exceed_the_rate(backend: Backend) -> None:
    backend.enqueue_many([rated(limit=5)] * 40, now=T0)
    barrier = threading.Barrier(8)
    got: list[Job] = []
    lock = threading.Lock()

    def run() -> None:
        barrier.wait()
        for _ in range(3):
            jobs = claim(backend, 3, now=T0 + 1)
            with lock:
                got.extend(jobs)

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(got) == 5


def test_concurrency_and_rate_together(backend: Backend) -> None:
    both = replace(limited(limit=1), rate_key="R", rate_limit=2, rate_period=60.0)
    backend.enqueue_many([both] * 4, now=T0)
    [a] = claim(backend, 5, now=T0)
    backend.ack(lease(a), None, now=T0)
    [b] = claim(backend, 5, now=T0 + 1)
    backend.ack(lease(b), None, now=T0 + 1)
    assert claim(backend, 5, now=T0 + 2) == []  # a slot is free but the rate is spent
    assert len(claim(backend, 5, now=T0 + 61)) == 1


def test_limits_show_on_the_job(backend: Backend) -> None:
    [r] = backend.enqueue_many([replace(limited("user:1", 4), rate_key="api", rate_limit=9, rate_period=2.5)],
                               now=T0)
    job = backend.get(r.id)
    assert job is not None
    assert (job.concurrency_key, job.concurrency_limit) == ("user:1", 4)
    assert (job.rate_key, job.rate_limit, job.rate_period) == ("api", 9, 2.5)


# -- through the public API and real workers ----------------------------------------------------

def test_a_task_concurrency_limit_holds_across_two_workers(app: Conveyor) -> None:
    lock = threading.Lock()
    now_running = [0]
    peak = [0]

    @app.task(name="scarce", concurrency_limit=2)
    def scarce(n: int) -> None:
        with lock:
            now_running[0] += 1
            peak[0] = max(peak[0], now_running[0])
        time.sleep(0.05)
        with lock:
            now_running[0] -= 1

    @app.task(name="free_flowing")
    def free_flowing(n: int) -> None: ...

    jobs = scarce.enqueue_many([(i,) for i in range(16)]) + free_flowing.enqueue_many([(i,) for i in range(16)])
    with running_worker(app, concurrency=6), running_worker(app, concurrency=6):
        done = [wait_for_job(app, j.id, timeout=30) for j in jobs]
    assert all(j.state is JobState.SUCCEEDED and j.attempts == 1 for j in done)
    assert peak[0] == 2
    # Store-side check: no two scarce jobs' run intervals overlap more than 2 deep.
    spans = sorted((j.attempted_at or 0, j.finished_at or 0) for j in done if j.task == "scarce")
    for start, _ in spans:
        assert sum(1 for s, f in spans if s <= start < f) <= 2


def test_a_per_key_limit_from_options(app: Conveyor) -> None:
    @app.task(name="per_customer")
    def per_customer(customer: str) -> None:
        time.sleep(0.02)

    jobs = [per_customer.options(concurrency_key=f"cust:{c}", concurrency_limit=1).enqueue(c)
            for c in ("a", "a", "a", "b", "b", "b")]
    with running_worker(app, concurrency=6):
        done = [wait_for_job(app, j.id, timeout=30) for j in jobs]
    for key in ("a", "b"):
        spans = sorted((j.attempted_at or 0, j.finished_at or 0) for j in done if j.args["customer"] == key)
        assert all(f <= s2 for (_, f), (s2, _) in itertools.pairwise(spans)), spans


def test_a_rate_limited_task_starts_at_most_n_per_period(app: Conveyor) -> None:
    @app.task(name="api_call", rate_limit="4/s")
    def api_call(n: int) -> None: ...

    jobs = api_call.enqueue_many([(i,) for i in range(10)])
    with running_worker(app, concurrency=8):
        done = [wait_for_job(app, j.id, timeout=30) for j in jobs]
    starts = sorted(j.attempted_at or 0 for j in done)
    assert all(j.attempts == 1 for j in done)  # waiting for the rate used no attempts
    for i, s in enumerate(starts):
        assert sum(1 for x in starts[i:] if x < s + 1.0) <= 4, starts
    assert starts[-1] - starts[0] >= 2.0  # 10 starts at 4 per second need over two windows


def test_bad_limits_are_refused(app: Conveyor) -> None:
    import pytest

    from conveyor.errors import ConfigurationError

    for bad in ("4 per s", "0/s", "5/0s", (0, 1.0), (3, -1)):
        with pytest.raises(ConfigurationError):
            app.task(name="bad_rate", rate_limit=bad)(lambda: None)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        app.task(name="bad_conc", concurrency_limit=0)(lambda: None)

    @app.task(name="ok")
    def ok() -> None: ...

    with pytest.raises(ConfigurationError, match="together"):
        ok.options(concurrency_key="x").enqueue()
    assert ok.options(rate_limit="10/m").enqueue().rate_period == 60.0
