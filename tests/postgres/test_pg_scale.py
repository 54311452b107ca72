"""Scale on PostgreSQL: 4 real worker processes drain a 10,000-job backlog, every job exactly once.

``CONVEYOR_SCALE_JOBS`` (default 10000) sets the number of jobs, for machines that cannot do
10,000 within the test's time budget. The lease (30 s) is far longer than any job, so no lease
expires and at-least-once must in fact be exactly once: each run appends a line to a marker file
outside the database, and the test counts those lines per job.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pgrig import PgRig, fresh_schema, read_marker, runs_per_job

from conveyor.backends.postgres.queries import ack_claim_sql

JOBS = int(os.environ.get("CONVEYOR_SCALE_JOBS", "10000"))
WORKERS = 4
CONCURRENCY = 8
BATCH = 1000

pytestmark = pytest.mark.process


@pytest.fixture
def pg_rig(tmp_path: Path) -> Iterator[PgRig]:
    """A fresh schema in the machine's PostgreSQL and the worker processes of one test."""
    with fresh_schema() as url:
        rig = PgRig(tmp_path, url)
        try:
            yield rig
        finally:
            rig.close()


def claim_plan(rig: PgRig) -> str:
    """EXPLAIN of the backend's own claim statement, as the worker runs it (without executing it)."""
    params = {"queue": "default", "now": None, "worker_id": "explain", "lease_s": 30.0,
              "claim_id": "0" * 24, "start": CONCURRENCY, "ids": [], "tokens": [], "results": []}
    statement = ack_claim_sql(CONCURRENCY).decode()
    return "\n".join(str(r[0]) for r in rig.sql("EXPLAIN " + statement, params))


@pytest.mark.timeout(300)
def test_four_workers_drain_backlog_each_job_exactly_once(pg_rig: PgRig) -> None:
    rig = pg_rig
    marker = rig.marker()
    task = rig.task()

    t0 = time.monotonic()
    ids: list[int] = []
    for start in range(0, JOBS, BATCH):
        ids += [j.id for j in task.enqueue_many([(str(marker),)] * min(BATCH, JOBS - start))]
    enqueue_s = time.monotonic() - t0
    assert len(set(ids)) == JOBS
    assert rig.states() == {"available": JOBS}

    # The claim must find its jobs through the partial index that matches its WHERE and ORDER
    # BY: with statistics as a fresh table has them, and after ANALYZE of the full backlog.
    for when in ("before ANALYZE", "after ANALYZE"):
        plan = claim_plan(rig)
        assert "conveyor_jobs_claim" in plan, f"claim does not use the partial index {when}:\n{plan}"
        rig.sql("ANALYZE conveyor_jobs")

    t1 = time.monotonic()
    workers = [rig.worker(concurrency=CONCURRENCY, visibility_timeout=30.0, poll_interval=0.5)
               for _ in range(WORKERS)]
    rig.wait_started(*workers)
    states = rig.wait_all(JOBS, timeout=240)
    drain_s = time.monotonic() - t1
    assert states == {"succeeded": JOBS}, states

    # Exactly once: one marker line per job, for every job, and attempt 1 in the store.
    recs = read_marker(marker)
    runs = runs_per_job(recs)
    dups = {j: n for j, n in runs.items() if n > 1}
    assert not dups, f"{len(dups)} jobs ran more than once (no lease expired): {list(dups.items())[:10]}"
    assert set(runs) == set(ids), f"{len(set(ids) - set(runs))} jobs never ran"
    assert len(recs) == JOBS
    assert all(r["attempt"] == 1 for r in recs)
    (not_once,) = rig.sql("SELECT count(*) FROM conveyor_jobs WHERE attempt <> 1 OR state <> 'succeeded'"
                          " OR lease_token IS NOT NULL OR finished_at IS NULL")[0]
    assert not_once == 0
    assert rig.sql("SELECT coalesce(sum(value), 0) FROM conveyor_counters WHERE name = 'lease_expired'") \
        == [(0,)]
    # Every process took part (they compete through SKIP LOCKED, not a partition).
    by_pid = {p.pid: 0 for p in workers}
    for r in recs:
        by_pid[r["pid"]] = by_pid.get(r["pid"], 0) + 1
    assert set(by_pid) == {p.pid for p in workers}, by_pid
    assert all(n > 0 for n in by_pid.values()), by_pid

    for p in workers:
        assert p.alive(), f"{p!r} died:\n{p.stderr()[-3000:]}"
        p.popen.send_signal(signal.SIGTERM)
    for p in workers:
        assert p.popen.wait(timeout=30) == 0, p.stderr()[-3000:]
    print(f"\nscale: {JOBS} jobs, {WORKERS} workers x {CONCURRENCY}: enqueue_many {enqueue_s:.2f}s, "
          f"drain {drain_s:.2f}s incl. process start ({JOBS / drain_s:,.0f} jobs/s); "
          f"jobs per worker {sorted(by_pid.values())}")
