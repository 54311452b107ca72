"""Backend contract under concurrency: many claimers, each job handed out exactly once."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

import pytest
from support import T0, new_job

from conveyor import JobState
from conveyor.backends.base import Backend

JOBS = 500
THREADS = 8
# moto, the SQS server the tests run, answers a receive in about 130 ms of its own CPU: 500 jobs
# took 54 s a variant at load 5 and ran past the test timeout under a loaded full run. 150 still
# gives every one of the 8 threads several claims against the others.
SQS_JOBS = 150


def jobs_for(backend: Backend) -> int:
    return SQS_JOBS if getattr(getattr(backend, "transport", None), "kind", "") == "SQS" else JOBS


def claim_concurrently(backends: list[Backend]) -> Counter[int]:
    """Each thread claims small batches until the queue is empty; returns claims per job id."""
    claimed: list[list[int]] = [[] for _ in backends]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(backends))

    def run(i: int) -> None:
        try:
            barrier.wait(10)
            while batch := backends[i].claim(
                "default", 5, worker_id=f"w{i}", lease_s=60, now=T0 + 1
            ):
                claimed[i].extend(j.id for j in batch)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(backends))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "claimer threads hung"
    assert not errors, errors
    assert sum(1 for c in claimed if c) >= 2, (
        "expected the claims to be spread over several threads"
    )
    return Counter(i for c in claimed for i in c)


def _check(backend: Backend, ids: list[int], counts: Counter[int]) -> None:
    n = len(ids)
    duplicates = {i: n for i, n in counts.items() if n > 1}
    assert duplicates == {}, f"jobs claimed more than once: {duplicates}"
    assert set(counts) == set(ids)
    assert sum(counts.values()) == n
    jobs = backend.list_jobs(limit=n + 1).jobs
    assert len(jobs) == n
    assert all(j.state is JobState.RUNNING and j.attempts == 1 for j in jobs)
    assert len({j.lease_token for j in jobs}) == n


@pytest.mark.parametrize("sharing", ["one-backend", "backend-per-thread"])
@pytest.mark.needs("listing")
def test_concurrent_claims_hand_out_each_job_exactly_once(
    backend: Backend, open_store: Callable[[], Backend], sharing: str
) -> None:
    n = jobs_for(backend)
    ids = [r.id for r in backend.enqueue_many([new_job(args={"n": i}) for i in range(n)], now=T0)]
    assert len(set(ids)) == n

    # One Backend shared between threads, or one each.
    make: Callable[[], Backend] = (lambda: backend) if sharing == "one-backend" else open_store
    counts = claim_concurrently([make() for _ in range(THREADS)])
    _check(backend, ids, counts)
