"""R1b: a worker SIGKILLed at fixed points of a job's life, on every backend.

``CONVEYOR_FAULTPOINT=<point>`` (src/conveyor/faultpoints.py) makes worker A kill itself there:

* ``after_claim``: a claim returned jobs, none started;
* ``in_handler``: the task did its side effect and has not returned (the task calls the hook);
* ``before_ack``: the task returned, its ack is not sent;
* ``after_ack``: an ack's store call returned (committed).

For each point, K jobs wait on a queue of their own; A (concurrency K, lease 1 s) claims all K
in one claim, and the K attempts meet (a barrier) after their side effect, so every one of
them has done it before the first reaches the kill point. Then worker B, without the hook,
takes over. The four points run side by side, one A per queue, one B for all four.

Pass, per job (K/K unless said): ``after_claim``: side effects 1, attempts 2, its first error
``lease_expired``. ``in_handler``, ``before_ack``: side effects 2, attempts 2. ``after_ack``:
the jobs of the committed ack batch (at least 1) have side effects 1 and attempts 1; the rest
side effects 2 and attempts 2. Every job succeeded, the checker finds nothing lost, and B
takes no lease back before it ran out, nor more than 2.5 s (B's longest reaper pause, 1.5 s, +
slack) after it ran out (the take-back is the ``lease_expired`` error's store time; attempt 2
starts after it, once B has a free slot). CI: K = 25; full: K = 100 (plan: 50).
"""

from __future__ import annotations

import signal
import time
from collections import defaultdict

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

from conveyor import JobState

pytestmark = [pytest.mark.faults, pytest.mark.process]

POINTS = ("after_claim", "in_handler", "before_ack", "after_ack")
K = pick(25, 100)
LEASE = 1.0


@pytest.mark.timeout(120)
def test_kill_points(fault_store: FaultStore, make_cluster) -> None:  # type: ignore[no-untyped-def]
    seed, _ = make_rng(f"R1b kill points / {fault_store.name}")
    cluster = make_cluster(fault_store.url)
    app = client_app(fault_store.url)
    try:
        history = History()
        task = app.tasks["fault.work"]
        n_of: dict[str, list[int]] = {}
        for i, point in enumerate(POINTS):
            ns = list(range(i * 1000, i * 1000 + K))
            n_of[point] = ns
            queued = task.options(queue=f"kp_{point}")
            for n in ns:
                history.record(n, lambda n=n, q=queued: q.enqueue(n, together=K).id)  # type: ignore[misc]
        assert len(history.ok_ids()) == K * len(POINTS)

        victims = {p: cluster.spawn(WorkerSpec(concurrency=K, lease=LEASE, queues=f"kp_{p}",
                                               env={"CONVEYOR_FAULTPOINT": p}), name=f"A-{p}", wait=False)
                   for p in POINTS}
        died: dict[str, float] = {}

        def all_died() -> bool:
            for p, proc in victims.items():
                if p not in died and not proc.alive():
                    died[p] = time.time()
            return len(died) == len(POINTS)

        wait_until(all_died, 60, lambda: f"every A to hit its kill point (died: {sorted(died)})\n{cluster.diagnosis()}")
        for p, proc in victims.items():
            assert proc.popen.returncode == -signal.SIGKILL, f"A-{p} exited {proc.popen.returncode}:\n{proc.stderr()}"
        b = cluster.spawn(WorkerSpec(concurrency=8, lease=LEASE, queues=",".join(f"kp_{p}" for p in POINTS)),
                          name="B")
        b_ready = time.time()
        drain(app.backend, 60, cluster.diagnosis)

        effects = read_effects(cluster.log)
        jobs = all_jobs(app.backend)
        report = check("R1b kill points", fault_store.name, seed, history, effects, jobs)
        report.faults = {"sigkill": len(POINTS)}
        runs: dict[int, list[dict]] = defaultdict(list)  # type: ignore[type-arg]
        for r in effects:
            runs[r["n"]].append(r)
        by_n = {int(j.args["n"]): j for j in jobs}

        outcome: dict[str, str] = {}
        # When B's reaper took each lease back (the store's clock, on this machine), not when
        # attempt 2 started: with K jobs per queue and concurrency 8 a start also waits for a slot.
        reclaim_delays: list[float] = []  # lease taken back, seconds after A died
        late: list[float] = []  # ... after the lease ran out, or after B was up if later
        start_lags: list[float] = []  # attempt 2 started, seconds after its lease was taken back
        for p in POINTS:
            per_job = []
            for n in n_of[p]:
                job = by_n[n]
                assert job.state is JobState.SUCCEEDED, (p, job)
                attempts = [r["attempt"] for r in sorted(runs[n], key=lambda r: r["attempt"])]
                per_job.append((job.attempts, len(attempts)))
                if job.attempts == 2:
                    second = [r for r in runs[n] if r["attempt"] == 2]
                    assert second and second[0]["pid"] == b.pid, (p, n, runs[n])
                    assert job.errors and job.errors[0]["kind"] == "lease_expired", (p, job.errors)
                    taken_back = float(job.errors[0]["at"])
                    reclaim_delays.append(taken_back - died[p])
                    late.append(taken_back - max(died[p] + LEASE, b_ready))
                    start_lags.append(second[0]["t0"] - taken_back)
            counts = dict(sorted((f"attempts={a} runs={r}", per_job.count((a, r))) for a, r in set(per_job)))
            outcome[p] = ", ".join(f"{k}: {v}" for k, v in counts.items())
            if p == "after_claim":
                assert per_job == [(2, 1)] * K, (p, counts)
            elif p in ("in_handler", "before_ack"):
                assert per_job == [(2, 2)] * K, (p, counts)
            else:  # after_ack: the committed batch ran once; the rest twice
                assert set(per_job) <= {(1, 1), (2, 2)}, (p, counts)
                assert per_job.count((1, 1)) >= 1, (p, counts)
        report.figures = {"per_point": outcome,
                          "reclaim_after_death_s": f"{min(reclaim_delays):.2f}..{max(reclaim_delays):.2f}",
                          "reclaim_after_due_s": f"{min(late):.2f}..{max(late):.2f}",
                          "start_after_reclaim_s": f"{min(start_lags):.2f}..{max(start_lags):.2f}"}
        report.emit()
        report.assert_clean(context=cluster.diagnosis())
        # Reclaimed after the lease, not before (A claimed just before it died), and soon after.
        assert min(reclaim_delays) >= LEASE - 0.5, sorted(reclaim_delays)[:5]
        assert max(late) <= 2.5, sorted(late)[-5:]
        assert min(start_lags) >= -0.05, sorted(start_lags)[:5]  # no attempt 2 before the take-back
    finally:
        app.close()
