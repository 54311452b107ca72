"""R15: the claim is atomic under contention (32 claimers, 5,000 jobs, each job handed out
once); R7: a job that always fails runs exactly max_attempts times and goes dead with every
error kept, and replaying it from the dead-letter queue twice at once (a double click) makes
exactly one new round; R17: 50 concurrent enqueues with one unique key make exactly one job,
and the other 49 get its id. On every backend. R16 (PostgreSQL, the store with transactional
enqueue): a job enqueued in a transaction that rolls back never exists and never runs (a
worker watches for 5 s); committed, it runs exactly once."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import psycopg
import pytest
from pgrig import fresh_schema
from support import running_worker, wait_for_job

from conveyor import Conveyor
from conveyor.backends.base import Backend, Lease, NewJob
from conveyor.job import JobState
from conveyor.retry import RetryPolicy

CLAIMERS = 32
JOBS = 5000


def test_r15_thirty_two_claimers_hand_out_each_job_once(backend: Backend) -> None:
    job = NewJob(task="t", queue="default", args="{}", max_attempts=3, timeout=30)
    for start in range(0, JOBS, 1000):
        backend.enqueue_many([job] * min(1000, JOBS - start))
    claimed: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(CLAIMERS)
    errors: list[BaseException] = []

    def claimer(i: int) -> None:
        barrier.wait()
        try:
            while True:
                got = backend.claim("default", 8, worker_id=f"w{i}", lease_s=300)
                if not got:
                    return
                acked = backend.ack_many([(Lease(j.id, j.lease_token or ""), None) for j in got])
                assert all(acked)
                with lock:
                    claimed.extend(j.id for j in got)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(CLAIMERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    twice = [job_id for job_id, n in Counter(claimed).items() if n > 1]
    assert not twice, f"{len(twice)} job(s) handed out twice"
    assert len(claimed) == JOBS
    stats = {q.queue: q for q in backend.stats().queues}["default"]
    assert (stats.succeeded, stats.available, stats.running) == (JOBS, 0, 0)


@pytest.mark.parametrize("max_attempts", [1, 3, 5])
def test_r7_exactly_max_attempts_then_one_replay_per_double_click(make_app: object, max_attempts: int) -> None:
    app: Conveyor = make_app(retry=RetryPolicy(base=0.01, factor=1.0, cap=0.02))  # type: ignore[operator]
    runs: Counter[int] = Counter()

    @app.task(name="always_fails", max_attempts=max_attempts)
    def always_fails(n: int) -> None:
        runs[n] += 1
        raise RuntimeError(f"failure {runs[n]}")

    job = always_fails.enqueue(1)
    with running_worker(app):
        dead = wait_for_job(app, job.id, "dead", timeout=30)
    assert runs[1] == max_attempts and dead.attempts == max_attempts
    assert [e["attempt"] for e in dead.errors] == list(range(1, max_attempts + 1))

    # Two operators (or one double click) replay it at the same moment. No worker runs
    # meanwhile: one that finished the replayed round between the clicks would make the second
    # click a real second replay, which it would be.
    barrier = threading.Barrier(2)
    replayed: list[int] = []

    def replay() -> None:
        barrier.wait()
        replayed.append(app.backend.redrive([job.id]))

    clicks = [threading.Thread(target=replay) for _ in range(2)]
    for c in clicks:
        c.start()
    for c in clicks:
        c.join(10)
    assert sorted(replayed) == [0, 1]
    with running_worker(app):
        again = wait_for_job(app, job.id, "dead", timeout=30)
    assert runs[1] == 2 * max_attempts  # one new round of max_attempts, not two
    assert again.attempts == max_attempts and again.meta.get("redriven") == 1
    # Replaying a job that is not dead changes nothing.
    ok = app.get_task("always_fails").options(max_attempts=1).enqueue(2)
    assert app.backend.redrive([ok.id]) == 0
    assert app.get_job(ok.id).state is JobState.AVAILABLE


def test_r17_fifty_concurrent_enqueues_of_one_key_make_one_job(backend: Backend) -> None:
    barrier = threading.Barrier(50)
    results = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def enqueue(i: int) -> None:
        job = NewJob(task="t", queue="default", args=json.dumps({"caller": i}), max_attempts=3, timeout=30,
                     unique_key="r17")
        barrier.wait()
        try:
            [res] = backend.enqueue_many([job])
        except BaseException as exc:
            errors.append(exc)
            return
        with lock:
            results.append(res)

    threads = [threading.Thread(target=enqueue, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]
    assert len(results) == 50
    assert sum(r.created for r in results) == 1, "exactly one call creates the job"
    assert len({r.id for r in results}) == 1, "the other 49 get the existing job's id"
    page = backend.list_jobs(limit=100)
    assert [j.id for j in page.jobs] == [results[0].id]


def test_r16_rolled_back_enqueue_never_runs_and_committed_runs_once() -> None:
    with fresh_schema() as url:  # fails in CI, skips locally, without PostgreSQL
        app = Conveyor(url, visibility_timeout=5)
        runs: list[str] = []

        @app.task(name="r16")
        def r16(tag: str) -> None:
            runs.append(tag)

        try:
            app.backend.schema_version()  # migrate outside the callers' transactions
            with running_worker(app, concurrency=4, poll_interval=0.05):
                with psycopg.connect(url) as conn:
                    rolled = r16.enqueue("rolled back", connection=conn)
                    conn.rollback()
                time.sleep(5)  # the plan's window: a worker polling all along finds nothing
                assert runs == []
                assert app.backend.get(rolled.id) is None
                assert app.backend.list_jobs(limit=10).jobs == []
                with psycopg.connect(url) as conn:
                    kept = r16.enqueue("committed", connection=conn)
                    time.sleep(0.5)  # not committed yet: invisible to the worker
                    assert runs == []
                    conn.commit()
                done = wait_for_job(app, kept.id)
                time.sleep(1)  # room for a second run, should there be one
            assert done.state is JobState.SUCCEEDED and done.attempts == 1
            assert runs == ["committed"]
        finally:
            app.close()
