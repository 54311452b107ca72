"""Many slots, short jobs, short leases: the shape in which a worker's own writes (heartbeats
over every running job, batched acks, acks riding claims) collide on the same rows many times a
second. Each job must run exactly once and succeed on its first attempt: on PostgreSQL a
deadlock fails a heartbeat or an ack, and a failed ack throws a finished job's success away to
be run again. Prefetch as many as the slots: held jobs given back are released, a third writer
over the same rows. On every backend (SQLite takes one writer at a time, BEGIN IMMEDIATE: no
deadlock can form, and the test shows it). CI: 32 slots, 4,000 jobs, 1 s lease. Full: 48
slots, 30,000 jobs, 0.6 s lease.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter

import psycopg
from scalekit import report, size
from stores import POSTGRES_URL
from support import running_worker, wait_until

from conveyor import Conveyor, current_job

SLOTS = size(32, 48)
JOBS = size(4_000, 30_000)
LEASE_S = size(1.0, 0.6)


class Deadlocks(logging.Handler):
    """Every record of the worker's loggers that reports a deadlock (a failed heartbeat, ack,
    release or claim logs the store's error, which names it)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage() + (logging.Formatter().formatException(record.exc_info) if record.exc_info else "")
        if "deadlock" in text.lower():
            self.seen.append(text.splitlines()[0])


def _server_deadlocks(url: str) -> int | None:
    """PostgreSQL's deadlock count for the database (shared with other tests: reported, not
    asserted); None for other stores."""
    if not url.startswith("postgres"):
        return None
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        row = conn.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()").fetchone()
    assert row is not None
    return int(row[0])


def test_many_slots_short_leases_no_deadlock_no_rerun(store_url: str) -> None:
    app = Conveyor(store_url, visibility_timeout=LEASE_S)
    runs: Counter[int] = Counter()
    late: list[int] = []  # jobs that ran on an attempt after the first
    lock = threading.Lock()

    @app.task(name="short", max_attempts=5, timeout=30)
    def short(n: int) -> int:
        ctx = current_job()
        assert ctx is not None
        time.sleep(random.uniform(0.001, 0.03))
        with lock:
            runs[n] += 1
            if ctx.attempt != 1:
                late.append(n)
        return n

    deadlocks = Deadlocks()
    logger = logging.getLogger("conveyor")
    logger.addHandler(deadlocks)
    try:
        for start in range(0, JOBS, 1_000):
            short.enqueue_many([(n,) for n in range(start, min(start + 1_000, JOBS))])
        before = _server_deadlocks(store_url)
        began = time.monotonic()
        with running_worker(app, concurrency=SLOTS, prefetch=SLOTS, poll_interval=0.2, maintenance_interval=0.5) as wt:
            wait_until(lambda: sum(q.succeeded for q in app.backend.stats().queues) + sum(
                q.dead for q in app.backend.stats().queues) >= JOBS, timeout=size(120, 1800), interval=0.2,
                message="every job finished")
            took = time.monotonic() - began
        counters = wt.worker.counters
        queues = app.backend.stats().queues
        succeeded = sum(q.succeeded for q in queues)
        app.close()  # a session reports its deadlocks to pg_stat_database by the time it ends
        after = _server_deadlocks(store_url)
        reruns = sum(c - 1 for c in runs.values() if c > 1)
        name = store_url.split(":", 1)[0].replace("postgresql", "postgres")
        report("many_slots", name, slots=SLOTS, jobs=JOBS, lease_s=LEASE_S,
               seconds=round(took, 1), jobs_per_s=round(JOBS / took), worker_deadlocks=len(deadlocks.seen),
               server_deadlocks_db=None if before is None or after is None else after - before,
               reruns=reruns, late_attempts=len(late), lease_lost=counters.lease_lost)
        assert deadlocks.seen == []
        assert succeeded == JOBS and late == []  # every job succeeded, on its first attempt
        assert len(runs) == JOBS and reruns == 0  # and ran exactly once
        assert counters.lease_lost == 0 and counters.succeeded == JOBS
    finally:
        logger.removeHandler(deadlocks)
        app.close()
