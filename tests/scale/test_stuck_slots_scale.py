"""Stuck slots under load: a worker with many slots, most of them held by sync tasks hung past
their timeout (threads cannot be killed), runs a stream of short jobs on the slots that are
left. A stuck slot must never be handed out: at no moment do more short tasks run than the
free slots, every short job runs exactly once, the heartbeat counts the stuck slots all along,
and once the hung calls return the slots are free again (stuck 0). CI: 16 slots, 10 stuck,
2,000 jobs. Full: 48 slots, 40 stuck, 20,000 jobs.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

from scalekit import report, size
from support import running_worker, wait_until

from conveyor import Conveyor, JobState

SLOTS = size(16, 48)
STUCK = size(10, 40)
JOBS = size(2_000, 20_000)


def test_stuck_slots_are_never_handed_out_under_load(store_url: str) -> None:
    app = Conveyor(store_url, visibility_timeout=1.5)
    gate = threading.Event()
    lock = threading.Lock()
    runs: Counter[int] = Counter()
    active = 0
    most = 0

    @app.task(name="hang", timeout=0.2, max_attempts=1)
    def hang() -> None:
        gate.wait(600)

    @app.task(name="short", timeout=30)
    def short(n: int) -> int:
        nonlocal active, most
        with lock:
            active += 1
            most = max(most, active)
            runs[n] += 1
        time.sleep(0.001)
        with lock:
            active -= 1
        return n

    try:
        with running_worker(app, concurrency=SLOTS, poll_interval=0.2, maintenance_interval=0.5) as wt:
            hung = hang.enqueue_many([() for _ in range(STUCK)])

            def stuck_seen() -> int:
                return sum(w.stuck for w in app.backend.stats().workers if w.id == wt.worker.id)

            wait_until(lambda: stuck_seen() == STUCK, timeout=60, message=f"{STUCK} stuck slots in the heartbeat")
            began = time.monotonic()
            for start in range(0, JOBS, 1_000):
                short.enqueue_many([(n,) for n in range(start, min(start + 1_000, JOBS))])
            samples: list[int] = []

            def all_done() -> bool:
                stats = app.backend.stats()
                samples.extend(w.stuck for w in stats.workers if w.id == wt.worker.id)
                return sum(q.succeeded for q in stats.queues) >= JOBS

            wait_until(all_done, timeout=size(120, 1800), interval=0.2, message="every short job succeeded")
            took = time.monotonic() - began
            claimed_while_stuck = wt.worker.counters.claimed
            gate.set()
            wait_until(lambda: stuck_seen() == 0, timeout=60, message="stuck 0 once the hung calls returned")
        name = store_url.split(":", 1)[0].replace("postgresql", "postgres")
        report("stuck_slots", name, slots=SLOTS, stuck=STUCK, jobs=JOBS, seconds=round(took, 1),
               jobs_per_s=round(JOBS / took), most_short_at_once=most, heartbeats_sampled=len(samples),
               claimed=claimed_while_stuck)
        assert all(app.get_job(j.id).state is JobState.DEAD for j in hung)  # settled by their timeout
        assert most <= SLOTS - STUCK  # a stuck slot was never handed out
        assert samples and set(samples) == {STUCK}  # counted at every heartbeat read meanwhile
        assert len(runs) == JOBS and set(runs.values()) == {1}
        assert claimed_while_stuck == STUCK + JOBS
    finally:
        gate.set()
        app.close()
