"""R9: the visibility-expiry metric (every backend, in-process workers).

N jobs (the plan's 50) are claimed by a worker whose heartbeat is stalled (its heartbeat
interval set far past the lease: the tasks run on, nobody extends their 1 s leases), which does
not reap either, and whose tasks sleep 3 s. Once the gauge shows the N expired leases, a
healthy worker starts: its reaper takes each one back, and it runs attempt 2.

Pass: the store-wide ``conveyor_lease_expiries_total`` rises by exactly N; every job succeeds at
attempt 2, from the healthy worker, and its one error is ``lease_expired`` naming the stalled
worker; the stalled worker's late acks are refused (its result is not stored); the reapers'
``conveyor_reaped_jobs_total{outcome="requeued"}`` counts N (expiry goes through the same
metric hooks as other outcomes); and the gauge ``conveyor_expired_leases`` (running jobs past
their lease, not yet reaped), read every 50 ms through the run, shows all N, and is back to 0
(for good) within the reaper's first pass.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support import WorkerThread, wait_until

from conveyor import Conveyor, current_job
from conveyor.job import JobState

N, LEASE, SLEEP = 50, 1.0, 3.0
REAPER_S = 0.5  # maintenance_interval; each pass waits U(0.5, 1.5) x this


def metric(app: Conveyor, name: str, **labels: str) -> float:
    assert app.metrics is not None
    for family in text_string_to_metric_families(generate_latest(app.metrics.registry).decode()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def succeeded(app: Conveyor) -> int:
    return sum(q.succeeded for q in app.backend.stats().queues if q.queue == "default")


def test_r9_every_expired_lease_is_counted_once(app: Conveyor) -> None:
    app.enable_metrics()
    runs: dict[int, list[tuple[int, str]]] = defaultdict(list)
    lock = threading.Lock()

    @app.task(name="r9.slow", max_attempts=3)
    def slow(n: int) -> int:
        ctx = current_job()
        assert ctx is not None
        with lock:
            runs[n].append((ctx.attempt, threading.current_thread().name))
        time.sleep(SLEEP)
        return ctx.attempt

    before = metric(app, "conveyor_lease_expiries_total", queue="default")
    jobs = slow.enqueue_many([(n,) for n in range(N)])
    # The stalled worker does not reap either (its first maintenance pass would come after
    # half an hour): the healthy worker, started once the gauge has seen the expired leases,
    # is the only reaper, so the rise is seen for sure and its end is the healthy reaper's.
    stalled = WorkerThread(app, concurrency=N, visibility_timeout=LEASE, maintenance_interval=3600.0,
                           poll_interval=0.05)
    stalled.worker.heartbeat_interval = 3600.0  # the stall: no heartbeat while its tasks run
    healthy = WorkerThread(app, concurrency=N, visibility_timeout=30.0, maintenance_interval=REAPER_S,
                           poll_interval=0.05)
    gauge: list[tuple[float, float]] = []
    started: list[WorkerThread] = []
    try:
        started.append(stalled.start())
        wait_until(lambda: sum(len(r) for r in runs.values()) == N, 30, message="the stalled worker to start every job")
        # The gauge is read on a thread of its own every 50 ms, so its readings are evenly
        # spaced however long the completion checks take on a loaded machine.
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.is_set():
                gauge.append((time.monotonic(), metric(app, "conveyor_expired_leases", queue="default")))
                sampling.wait(0.05)

        sampler = threading.Thread(target=sample, name="r9-gauge")
        sampler.start()
        try:
            wait_until(lambda: any(v == N for _, v in gauge), 10, interval=0.05,
                       message="the gauge to show every stalled lease expired")
            healthy_at = time.monotonic()
            started.append(healthy.start())
            wait_until(lambda: succeeded(app) == N, 60, interval=0.1, message="every job to succeed at attempt 2")
            time.sleep(0.2)
        finally:
            sampling.set()
            sampler.join()
        time.sleep(SLEEP + 0.5)  # the stalled worker's late acks come in (and are refused)
    finally:
        for w in started:
            w.stop()
        for w in started:
            w.join()

    stored = [app.backend.get(j.id) for j in jobs]
    assert all(s is not None for s in stored)
    stalled_id = stalled.worker.id
    for job in stored:
        assert job is not None
        assert job.state is JobState.SUCCEEDED, job
        assert job.attempts == 2, job
        assert job.result == 2, job  # attempt 2's result: the stalled worker's ack was refused
        [error] = job.errors
        assert error["kind"] == "lease_expired" and error["attempt"] == 1, error
        assert error["worker_id"] == stalled_id, (error, stalled_id)
    assert sorted(a for r in runs.values() for a, _ in r) == [1] * N + [2] * N
    assert metric(app, "conveyor_lease_expiries_total", queue="default") - before == N
    assert metric(app, "conveyor_reaped_jobs_total", outcome="requeued") == N
    assert metric(app, "conveyor_reaped_jobs_total", outcome="dead") == 0

    # The gauge: it showed all N (waited for above), fell to 0 within the healthy worker's
    # first reaper pass (U(0.5, 1.5) x REAPER_S after it started, plus scrape and scheduling
    # slack), and never rose again.
    cleared = next(t for t, v in gauge if t > healthy_at and v == 0)
    assert all(v == 0 for t, v in gauge if t >= cleared), [v for t, v in gauge if t >= cleared]
    bound = 1.5 * REAPER_S + 1.0
    took = cleared - healthy_at
    assert took <= bound, f"expired leases stayed unreaped {took:.2f}s after a reaper started (bound {bound:.2f}s)"
    print(f"\nR9: {N} leases expired and reaped; gauge readings {len(gauge)}, "
          f"max {max(v for _, v in gauge):.0f}, cleared {took:.2f}s after the reaper started")
