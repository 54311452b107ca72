"""R2 under load: zombie workers. A nemesis SIGSTOPs a random busy worker for 3 x its lease,
then SIGCONTs it, over and over, while the others reclaim its jobs. The resumed zombie's
heartbeats and acks carry stale lease tokens and must be refused.

(tests/process/test_proc_crash.py has the single-job version on SQLite, with a byte-for-byte
snapshot of the row; this one runs on every backend, with hundreds of jobs and the checker.)

Pass: lost 0, unexpected 0, every job succeeded; every result is from the job's last attempt
(no stale ack accepted) and no attempt ran twice; duplicated <= pauses x concurrency; the
zombies did wake up holding leases they had lost (their "lease lost" / "outcome discarded"
log lines are counted and must be > 0, so the test cannot pass vacuously); every worker is
alive at the end. On SQLite and PostgreSQL a worker is not frozen while it holds the write
lock or an open transaction (that stalls the store for everyone; counted as skipped).
CI: 600 jobs; full: 3,000.
"""

from __future__ import annotations

import time

import pytest
from faultstore import FaultStore
from harness import (
    History,
    Nemesis,
    Producer,
    WorkerSpec,
    all_jobs,
    check,
    client_app,
    drain,
    make_rng,
    pick,
    read_effects,
)

pytestmark = [pytest.mark.faults, pytest.mark.process]

JOBS = pick(600, 3000)  # CI: 10 s of load, time for at least two pauses between skipped ones
WORKERS, CONCURRENCY, LEASE = 3, 4, 1.0
PAUSE = 3 * LEASE
RATE = 60.0


@pytest.mark.timeout(pick(150, 600))
def test_zombies_are_refused(fault_store: FaultStore, make_cluster) -> None:  # type: ignore[no-untyped-def]
    seed, rng = make_rng(f"R2 zombies / {fault_store.name}")
    cluster = make_cluster(fault_store.url, url_for=fault_store.url_for("fzombie-"))
    cluster.wait_started(*[cluster.spawn(WorkerSpec(concurrency=CONCURRENCY, lease=LEASE), wait=False)
                           for _ in range(WORKERS)])
    app = client_app(fault_store.url)
    try:
        history = History()
        jobs = [(n, round(rng.uniform(0.05, 0.3), 3)) for n in range(JOBS)]
        t0 = time.monotonic()
        nemesis = Nemesis(cluster, rng, interval=(0.8, 1.6), faults=("pause",), pause_s=PAUSE, keep=1,
                          pause_guard=fault_store.pause_guard("fzombie-"))
        nemesis.start()
        producer = Producer(app, history, jobs, rate=RATE).start()
        try:
            producer.join(timeout=JOBS / RATE + 120)
        finally:
            nemesis.stop()
        drain(app.backend, 60, cluster.diagnosis)
        elapsed = time.monotonic() - t0

        report = check("R2 zombies", fault_store.name, seed, history, read_effects(cluster.log),
                       all_jobs(app.backend))
        pauses = nemesis.counts().get("sigstop", 0)
        logs = cluster.stderr_all()
        refused = logs.count("the lease was lost") + logs.count("lease lost (expired or taken over)")
        report.faults = {"sigstop_3x_lease": pauses, "pauses_skipped_holding_a_lock": nemesis.skipped_pauses}
        report.duplicate_bound = pauses * CONCURRENCY
        report.figures = {"zombie_refusals_logged": refused, "elapsed_s": round(elapsed, 1),
                          "integrity": fault_store.integrity()}
        report.emit()

        assert not producer.errors, producer.errors[:3]
        report.assert_clean(context=cluster.diagnosis())
        assert pauses >= pick(2, 20), f"only {pauses} pauses"
        assert refused >= 1, "no zombie ever found its lease gone: nothing was tested"
        assert all(p.alive() for p in cluster.procs), cluster.diagnosis()
        if fault_store.sqlite_path is not None:
            assert fault_store.integrity() == "ok"
    finally:
        app.close()
