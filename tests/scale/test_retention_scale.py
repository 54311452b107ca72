"""Retention keeps up with a worker running jobs at several hundred per second.

A real worker (concurrency 8) runs no-op jobs as fast as it can while a producer keeps a
backlog waiting; ``result_ttl`` is 1 s. Every second the test counts the finished rows in the
store and the jobs the worker has completed. Retention keeps up when, at every sample, the
rows still there are no more than the jobs completed within the last ``result_ttl`` +
``prune_interval`` (+ a margin for the maintenance round and the pass itself): everything
older has been pruned. One batch of 1,000 per ``prune_interval`` (the old pass) falls behind
at any rate above 1,000 / ``prune_interval`` and the rows grow for the whole run.

CI: 12 s of load with a 2 s prune_interval. Full: 5 minutes and at least 100,000 jobs at the
default 60 s prune_interval.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from scalekit import report, size
from support import running_worker

from conveyor import Conveyor

LOAD_S = size(12.0, 300.0)
MIN_JOBS = size(0, 100_000)
PRUNE_INTERVAL = size(2.0, 60.0)
RESULT_TTL = 1.0
MARGIN_S = 5.0  # a maintenance round (~1 s), the pass's own batches and pauses, sampling
BACKLOG = 2000
CONCURRENCY = 8
ACKS_IN_FLIGHT = 2 * CONCURRENCY  # written to the store, not yet counted by the worker
BATCH = 500


def finished_rows(app: Conveyor) -> int:
    return sum(q.succeeded + q.cancelled for q in app.backend.stats(finished=True).queues)


@pytest.mark.timeout(size(120, 1800))
def test_finished_rows_stay_bounded_under_sustained_load(make_app: Callable[..., Conveyor], store_url: str) -> None:
    app = make_app(result_ttl=RESULT_TTL)

    @app.task(name="noop")
    def noop(i: int) -> int:
        return i

    stop = threading.Event()
    enqueued = 0

    def produce() -> None:
        nonlocal enqueued
        while not stop.is_set():
            waiting = sum(q.available for q in app.backend.stats(finished=False).queues)
            if waiting < BACKLOG:
                noop.enqueue_many([(i,) for i in range(BATCH)])
                enqueued += BATCH
            else:
                time.sleep(0.02)

    samples: list[tuple[float, int, int]] = []  # (monotonic, completed so far, finished rows)
    producer = threading.Thread(target=produce, name="producer", daemon=True)
    with running_worker(app, concurrency=CONCURRENCY, prune_interval=PRUNE_INTERVAL, maintenance_interval=1.0) as wt:
        producer.start()
        start = time.monotonic()
        try:
            while True:
                time.sleep(1.0)
                rows = finished_rows(app)  # first: every row it counts is in the counter read next
                now = time.monotonic()
                samples.append((now, wt.worker.counters.succeeded, rows))
                if now - start >= LOAD_S and samples[-1][1] >= MIN_JOBS:
                    break
        finally:
            stop.set()
            producer.join(30)
    elapsed = samples[-1][0] - start
    completed = samples[-1][1]
    window = RESULT_TTL + PRUNE_INTERVAL + MARGIN_S
    over = []
    for t, _, rows in samples:
        recent = [done for (s, done, _) in samples if s <= t]
        before = [done for (s, done, _) in samples if s <= t - window]
        in_window = recent[-1] - (before[-1] if before else 0)
        if rows > in_window + ACKS_IN_FLIGHT:
            over.append((round(t - start, 1), rows, in_window))
    max_rows = max(rows for _, _, rows in samples)
    # A worker's first pass comes at a random point of its first prune_interval (workers
    # started together spread out); from then on the steady state shows.
    first_drop = next((k for k in range(1, len(samples)) if samples[k][2] < samples[k - 1][2]), len(samples))
    steady = max((rows for _, _, rows in samples[first_drop:]), default=None)
    second_half = max(rows for _, _, rows in samples[len(samples) // 2:])
    report("retention_keeps_up", store_url.split(":", 1)[0], jobs=completed,
           jobs_per_s=round(completed / elapsed), seconds=round(elapsed), result_ttl_s=RESULT_TTL,
           prune_interval_s=PRUNE_INTERVAL, max_finished_rows=max_rows, max_rows_after_first_pass=steady,
           max_rows_second_half=second_half,
           finished_rows_at_end=samples[-1][2])
    assert not over, f"finished rows older than {window:g}s were still there (t, rows, completed in window): {over}"
