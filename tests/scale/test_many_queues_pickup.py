"""An idle worker on thousands of queues picks a job up without walking them.

A claim round used to call the store once per queue, in a weighted random order, until it met
the queue with the job: on 3,000 queues (a queue per tenant) an idle worker's pick-up took
440 ms on Redis, 34 ms on 300. A round on many queues now asks the store which have work
(Backend.ready_queues) and claims there. Asserted: the claims a job costs (a round trip each)
stay a handful whatever the number of queues; reported: the pick-up latency.

CI: 300 queues, 30 jobs. Full: 3,000 queues, 100 jobs, on every store.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import pytest
from scalekit import report, size
from support import running_worker

from conveyor import Conveyor, JobState

QUEUES = size(300, 3000)
JOBS = size(30, 100)


def test_an_idle_worker_on_many_queues_claims_only_where_the_job_is(
        make_app: Callable[..., Conveyor], store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    app = make_app()
    queues = [f"tenant-{i}" for i in range(QUEUES)]

    @app.task(name="noop")
    def noop(i: int) -> int:
        return i

    backend = app.backend
    calls = {"claims": 0}
    claim, ack_and_claim = backend.claim, backend.ack_and_claim

    def counting_claim(*a: Any, **kw: Any) -> Any:
        calls["claims"] += 1
        return claim(*a, **kw)

    def counting_ack_and_claim(*a: Any, **kw: Any) -> Any:
        calls["claims"] += 1
        return ack_and_claim(*a, **kw)

    monkeypatch.setattr(backend, "claim", counting_claim)
    monkeypatch.setattr(backend, "ack_and_claim", counting_ack_and_claim)
    rng = random.Random(7)
    pickup_ms: list[float] = []
    with running_worker(app, queues=queues, concurrency=8, poll_interval=5.0):
        time.sleep(1.0)  # idle: waiting on every queue
        for i in range(JOBS):
            t0 = time.perf_counter()
            job = noop.options(queue=rng.choice(queues)).enqueue(i)
            while (state := app.get_job(job.id).state) is not JobState.SUCCEEDED:
                assert state is not JobState.DEAD
                assert time.perf_counter() - t0 < 30, "not picked up in 30 s"
                time.sleep(0.0005)
            pickup_ms.append((time.perf_counter() - t0) * 1000)
            time.sleep(0.05)  # idle again before the next one
    per_job = calls["claims"] / JOBS
    # A round of claims per wake-up, plus the rare stale one; one per queue walked before.
    assert per_job <= 4, f"{calls['claims']} claims for {JOBS} jobs on {QUEUES} queues"
    pickup_ms.sort()
    report("many_queues_pickup", store_url.split(":", 1)[0], queues=QUEUES, jobs=JOBS,
           claims_per_job=round(per_job, 2),
           pickup_p50_ms=round(statistics.median(pickup_ms), 1),
           pickup_p90_ms=round(pickup_ms[int(len(pickup_ms) * 0.9) - 1], 1),
           pickup_max_ms=round(pickup_ms[-1], 1))
