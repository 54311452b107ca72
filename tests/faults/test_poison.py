"""R6: poison jobs mixed into good traffic, on every backend.

Three worker processes (concurrency 4, lease 1 s) under the product's supervisor
(``--processes 3``, which restarts a crashed child). Phase 1, the baseline: GOOD good jobs
(U(5, 20) ms each; CI 500, full 1,000) alone. Phase 2: the poison goes in first, at the head
of the queue, then GOOD more good jobs:

* ``fault.crash`` (max_attempts 3): ``os._exit(1)`` on every attempt, taking its worker down;
* ``fault.reject``: raises Reject;
* ``fault.huge_error`` (max_attempts 5): raises an exception with a 1,000,000-character message;
* ``fault.v2_only``: a task name this version does not know, written straight to the store
  (a job from a newer deployment).

Pass: all 2 x GOOD good jobs succeed (checker: lost 0, duplicated 0); crash: dead after exactly
3 attempts, each a ``lease_expired`` (a crash burns an attempt), run in 3 different processes.
The other poison is claimed beside the crash (it sits at the head of the queue too), and a
crash ends every attempt of its worker process: those attempts end ``lease_expired`` as well
and count (at most 3 x (concurrency - 1) of them; the figure is printed). Apart from those:
reject dead at its first own attempt, ``rejected``; huge dead after exactly 5 attempts, at
least 2 its own, every stored message cut to 2,000 characters; unknown task dead at its first
own attempt, ``unknown_task``, never run; the supervisor is alive and restarted a
child per crash; duplicated <= crashes x (concurrency - 1). No head-of-line blocking: the crash
holds the head of the queue from its first attempt to its third, a window of at least two
leases (each attempt ends lease_expired), and at least half of the phase-2 good jobs run inside
that window on the other processes. That is an order of events, not a stopwatch: a wall-clock
ratio (95 % of the good jobs done with poison vs without; the plan's >= 0.9 is for 8 cores) is
printed as a figure but not asserted, since on 2 shared cores one 1 s restart already halves it.
"""

from __future__ import annotations

import json
import re
import time

import pytest
from faultstore import FaultStore
from harness import (
    History,
    WorkerSpec,
    all_jobs,
    check,
    client_app,
    drain,
    make_rng,
    pick,
    read_effects,
)
from processrig import wait_until

from conveyor import Job, JobState
from conveyor.backends.base import NewJob

pytestmark = [pytest.mark.faults, pytest.mark.process]

GOOD = pick(500, 1000)
PROCS, CONCURRENCY, LEASE = 3, 4, 1.0


def run_good(app, history: History, rng, first_n: int, first_succeeded: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Enqueue GOOD jobs in one batch; wait until the store counts ``first_succeeded + GOOD``
    succeeded jobs (poison never succeeds). Seconds until 95 % and until all of them were done."""
    ns = list(range(first_n, first_n + GOOD))
    task = app.tasks["fault.work"]
    t0 = time.monotonic()
    history.record_many(ns, lambda: [j.id for j in task.enqueue_many(
        [(n, round(rng.uniform(0.005, 0.02), 4)) for n in ns])])
    want = first_succeeded + GOOD
    most = first_succeeded + int(GOOD * 0.95)
    seen = 0
    t95: float | None = None

    def done() -> bool:
        nonlocal seen, t95
        seen = sum(q.succeeded for q in app.backend.stats().queues)
        if t95 is None and seen >= most:
            t95 = time.monotonic() - t0
        return seen >= want

    wait_until(done, 120, lambda: f"{want} jobs to succeed (now {seen})", interval=0.05)
    assert t95 is not None
    return t95, time.monotonic() - t0


def kinds(job: Job) -> list[str]:
    return [e["kind"] for e in job.errors]


@pytest.mark.timeout(240)
def test_poison_goes_dead_and_good_jobs_flow(fault_store: FaultStore, make_cluster) -> None:  # type: ignore[no-untyped-def]
    seed, rng = make_rng(f"R6 poison mix / {fault_store.name}")
    cluster = make_cluster(fault_store.url)
    sup = cluster.spawn(WorkerSpec(concurrency=CONCURRENCY, lease=LEASE, processes=PROCS), name="sup")
    app = client_app(fault_store.url)
    try:
        history = History()
        base_s, base_all_s = run_good(app, history, rng, 0, 0)

        poison: dict[str, int] = {
            "crash": app.tasks["fault.crash"].enqueue(-1).id,
            "reject": app.tasks["fault.reject"].enqueue(-2).id,
            "huge": app.tasks["fault.huge_error"].enqueue(-3).id,
        }
        [unknown] = app.backend.enqueue_many([NewJob(task="fault.v2_only", queue="default",
                                                     args=json.dumps({"n": -4}), max_attempts=5, timeout=30.0)])
        poison["unknown"] = unknown.id
        mixed_s, mixed_all_s = run_good(app, history, rng, 10_000, GOOD)
        drain(app.backend, 90, cluster.diagnosis)

        jobs = all_jobs(app.backend)
        effects = read_effects(cluster.log)
        report = check("R6 poison mix", fault_store.name, seed, history, effects, jobs)
        by_id: dict[int, Job] = {j.id: j for j in jobs}
        p = {k: by_id[v] for k, v in poison.items()}
        ratio = base_s / mixed_s
        crash_runs = [r for r in effects if r["e"] == "crash"]
        # The window is fixed by the lease (>= 2 s), not by how fast this machine is; half of
        # GOOD jobs take ~0.5 s here at the baseline rate.
        first, last = (crash_runs[0]["t"], crash_runs[-1]["t"]) if crash_runs else (0.0, 0.0)
        beside = len({r["n"] for r in effects if r["e"] == "done" and r["n"] >= 10_000 and first <= r["t"] <= last})
        restarts = len(re.findall(r"exited with 1; restarting", sup.stderr()))
        report.faults = {"poison_jobs": len(poison), "worker_crashes": restarts}
        report.duplicate_bound = restarts * (CONCURRENCY - 1)
        report.figures = {"baseline_95pct_s": round(base_s, 2), "with_poison_95pct_s": round(mixed_s, 2),
                          "baseline_all_s": round(base_all_s, 2), "with_poison_all_s": round(mixed_all_s, 2),
                          "throughput_ratio": round(ratio, 2),
                          "good_jobs_beside_the_crash": beside, "crash_window_s": round(last - first, 2),
                          "poison": {k: f"{j.state}/{j.attempts}" for k, j in p.items()},
                          "poison_errors": {k: kinds(j) for k, j in p.items()},
                          "attempts_burned_beside_a_crash": sum(kinds(j).count("lease_expired")
                                                                for name, j in p.items() if name != "crash"),
                          "huge_message_stored_chars": max(len(e["message"]) for e in p["huge"].errors)}
        report.emit()

        report.assert_clean(context=cluster.diagnosis())
        crash = p["crash"]
        assert (crash.state, crash.attempts) == (JobState.DEAD, 3), crash
        assert [e["kind"] for e in crash.errors] == ["lease_expired"] * 3, crash.errors
        assert [r["attempt"] for r in crash_runs] == [1, 2, 3]
        assert len({r["pid"] for r in crash_runs}) == 3, "each crash takes a worker process down"
        # The other poison may have shared a worker process with the crash: such an attempt
        # ends as lease_expired (and counts). Apart from those, each fails as it should.
        rej = p["reject"]
        k = kinds(rej)
        assert rej.state is JobState.DEAD and k[-1] == "rejected" and set(k[:-1]) <= {"lease_expired"}, k
        assert rej.attempts == len(k), (rej.attempts, k)
        huge = p["huge"]
        k = kinds(huge)
        assert (huge.state, huge.attempts) == (JobState.DEAD, 5) and k.count("exception") >= 2, (huge.attempts, k)
        assert set(k) <= {"exception", "lease_expired"}, k
        assert all(len(e["message"]) <= 2000 for e in huge.errors), [len(e["message"]) for e in huge.errors]
        unk = p["unknown"]
        k = kinds(unk)
        assert unk.state is JobState.DEAD and k[-1] == "unknown_task" and set(k[:-1]) <= {"lease_expired"}, k
        assert "fault.v2_only" in unk.errors[-1]["message"]
        # Collateral: only a crash makes a lease expire here, and it takes at most the other
        # jobs of its worker process with it.
        collateral = sum(kinds(j).count("lease_expired") for name, j in p.items() if name != "crash")
        assert collateral <= 3 * (CONCURRENCY - 1), collateral
        assert sup.alive(), sup.stderr()[-3000:]
        assert restarts >= 3, f"{restarts} restarts logged by the supervisor"
        assert last - first >= 2 * LEASE * 0.9, (first, last)
        assert beside >= GOOD // 2, (f"{beside} of {GOOD} good jobs ran while the crash held the head of the queue "
                                     f"({last - first:.1f}s)")
    finally:
        app.close()
