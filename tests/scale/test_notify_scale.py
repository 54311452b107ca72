"""PostgreSQL's notification queue stays empty under sustained enqueues while the worker is busy.

Every single enqueue commits a NOTIFY, and the server keeps each notification until every
listening session has read it. The worker's two slots are held by blocking jobs, so it does
not wait for work, and producers enqueue one job per transaction without pause. The test
samples ``pg_notification_queue_usage()`` (the fraction of the server's 8 GB queue in use)
throughout, and at the end counts the notifications pending on the worker's listener.

The queue is the server's, shared with whatever else runs on it: the bound is on the growth
above the usage at the start. CI: 20,000 enqueues; full: 500,000.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from scalekit import report, size
from stores import postgres_store
from support import running_worker, wait_for_job, wait_until

from conveyor import Conveyor
from conveyor.backends.postgres import CHANNEL, PostgresBackend

ENQUEUES = size(20_000, 500_000)
PRODUCERS = 4
# 4 MB of the 8 GB queue: what a few seconds of enqueues at this rate would leave behind if a
# listener held them (the full size's 500,000 notifications are ~20 MB).
GROWTH_BOUND = 0.0005


@pytest.fixture
def pg_url(tmp_path: Path) -> Iterator[str]:
    with postgres_store(tmp_path) as url:
        yield url


def usage(conn: psycopg.Connection[tuple[float]]) -> float:
    row = conn.execute("SELECT pg_notification_queue_usage()").fetchone()
    assert row is not None
    return float(row[0])


@pytest.mark.timeout(size(300, 3600))
def test_notification_queue_stays_empty_with_a_busy_worker(pg_url: str) -> None:
    queue = f"q{uuid.uuid4().hex[:10]}"
    app = Conveyor(pg_url)
    release = threading.Event()

    @app.task(name="block", queue=queue)
    def block() -> None:
        release.wait(3600)

    @app.task(name="noop", queue=queue)
    def noop() -> None:
        pass

    backend = app.backend
    assert isinstance(backend, PostgresBackend)
    sampler = psycopg.connect(pg_url, autocommit=True)
    baseline = usage(sampler)
    peak = baseline
    per_producer = ENQUEUES // PRODUCERS

    def produce() -> None:
        for _ in range(per_producer):
            noop.enqueue()

    try:
        with running_worker(app, queues=queue, concurrency=2, poll_interval=0.2):
            wait_until(lambda: backend._listener is not None, timeout=10, message="the worker's first idle wait")
            blockers = [block.enqueue() for _ in range(2)]
            for job in blockers:
                wait_for_job(app, job.id, "running")
            producers = [threading.Thread(target=produce, daemon=True) for _ in range(PRODUCERS)]
            start = time.monotonic()
            for p in producers:
                p.start()
            while any(p.is_alive() for p in producers):
                peak = max(peak, usage(sampler))
                time.sleep(0.5)
            elapsed = time.monotonic() - start
            peak = max(peak, usage(sampler))
            sentinel = f"{queue}:end"
            sampler.execute("SELECT pg_notify(%s, %s)", [CHANNEL, sentinel])
            with backend._listen_lock:  # busy: the worker is not waiting on its listener
                conn = backend._listener
                assert conn is not None
                listening = conn.execute("SELECT count(*) AS n FROM pg_listening_channels()").fetchone()
                assert listening is not None
                pending = 0
                if listening["n"]:
                    for note in conn.notifies(timeout=60):
                        if note.payload == sentinel:
                            break
                        pending += note.payload == queue
                else:
                    pending = sum(1 for note in conn.notifies(timeout=0) if note.payload == queue)
            release.set()
    finally:
        release.set()
        sampler.close()
        app.close()
    report("notify_queue_busy_worker", "postgresql", enqueues=per_producer * PRODUCERS,
           enqueues_per_s=round(per_producer * PRODUCERS / elapsed), seconds=round(elapsed),
           queue_usage_start=baseline, queue_usage_max=peak, pending_on_listener=pending)
    assert pending == 0, f"{pending} wake-ups waited on the busy worker's listener"
    assert peak - baseline <= GROWTH_BOUND, f"the notification queue grew from {baseline} to {peak}"
