"""A worker SIGKILLed while it holds prefetched jobs: the jobs it never started are not charged
an attempt (issue 32 item 3), on every backend.

Worker A (concurrency 2, --prefetch 8, a prefetch hold longer than the test) claims all 10
jobs of its queue (max_attempts=1) in one claim: 2 start, 8 wait in its prefetch. Once its
heartbeats have renewed every lease (a heartbeat marks started jobs, and must not mark the
held ones), A is SIGKILLed. A reap past the leases' end (``now=``: no sleeping) finds: the 2
started jobs dead, their error saying the worker was lost mid-job; the 8 held ones available
again with attempts 0 and one stall, their error saying the lease ran out before they started.
(Before the fix all 10 went dead: "worker crashed mid-job".)
"""

from __future__ import annotations

import signal

import pytest
from faultstore import FaultStore
from harness import WorkerSpec, client_app
from processrig import wait_until

from conveyor import JobState

pytestmark = [pytest.mark.faults, pytest.mark.process]

LEASE = 2.0
QUEUE = "pf_kill"


@pytest.mark.timeout(120)
def test_sigkill_of_a_prefetching_worker_charges_only_the_started_jobs(
        fault_store: FaultStore, make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster(fault_store.url)
    app = client_app(fault_store.url)
    try:
        task = app.tasks["fault.work"].options(queue=QUEUE, max_attempts=1)
        ids = [j.id for j in task.enqueue_many([{"n": n, "sleep": 60.0} for n in range(10)])]
        a = cluster.spawn(WorkerSpec(concurrency=2, prefetch=8, prefetch_hold=600.0, lease=LEASE, queues=QUEUE),
                          name="A")

        def renewed() -> bool:
            jobs = [app.backend.get(i) for i in ids]
            return all(j is not None and j.state is JobState.RUNNING and j.attempted_at is not None
                       and j.lease_expires_at is not None and j.lease_expires_at > j.attempted_at + LEASE
                       for j in jobs)

        wait_until(renewed, 30, lambda: f"A to claim all 10 jobs and renew their leases\n{cluster.diagnosis()}")
        a.send(signal.SIGKILL)
        assert a.wait(30) == -signal.SIGKILL

        running = [app.backend.get(i) for i in ids]
        last_lease = max(j.lease_expires_at for j in running if j is not None and j.lease_expires_at is not None)
        reaped = app.backend.reap(now=last_lease + 1)
        assert sorted(reaped.dead) == ids[:2], reaped
        assert sorted(reaped.requeued) == ids[2:], reaped
        for job_id in ids[:2]:
            job = app.backend.get(job_id)
            assert job is not None and job.state is JobState.DEAD
            assert (job.attempts, job.stalls) == (1, 0)
            assert "mid-job" in job.errors[-1]["message"], job.errors
        for job_id in ids[2:]:
            job = app.backend.get(job_id)
            assert job is not None and job.state is JobState.AVAILABLE
            assert (job.attempts, job.stalls) == (0, 1), job
            assert "before the job started" in job.errors[-1]["message"], job.errors
    finally:
        app.close()
