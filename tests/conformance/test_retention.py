"""Retention: one prune pass deletes bounded batches until a batch comes back short, and one
pruner at a time runs across the fleet (a store-side lock every worker's pass takes first)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from support import T0, new_job

from conveyor import Conveyor
from conveyor.backends.base import Backend, ErrorInfo, Lease
from conveyor.retention import PRUNE_LOCK, Pruner, retention_rules

LEASE = 30.0
TTL = 50.0
BATCH = 1000


def finished(backend: Backend, n: int, *, at: float) -> set[int]:
    """``n`` jobs that succeeded at ``at``."""
    ids = {r.id for r in backend.enqueue_many([new_job() for _ in range(n)], now=at)}
    while True:
        jobs = backend.claim("default", BATCH, worker_id="w", lease_s=LEASE, now=at)
        if not jobs:
            break
        assert all(backend.ack_many([(Lease(j.id, j.lease_token or ""), None) for j in jobs], now=at))
    return ids


def kept(backend: Backend) -> set[int]:
    page = backend.list_jobs(limit=10_000)
    assert page.next_cursor is None
    return {j.id for j in page.jobs}


@pytest.mark.needs("results")
def test_one_pass_prunes_batches_until_one_comes_back_short(
    backend: Backend, make_app: Callable[..., Conveyor]
) -> None:
    app = make_app(result_ttl=TTL)
    finished(backend, 3500, at=T0)
    young = finished(backend, 5, at=T0 + 100)
    pruner = Pruner(backend, retention_rules(app), batch=BATCH, pause=0.0)

    outcome = asyncio.run(pruner.run(now=T0 + 100))

    assert (outcome.deleted, outcome.more, outcome.skipped) == (3500, False, False)
    assert kept(backend) == young


@pytest.mark.needs("results")
def test_a_pass_stops_at_its_batch_cap_and_says_there_is_more(
    backend: Backend, make_app: Callable[..., Conveyor]
) -> None:
    app = make_app(result_ttl=TTL)
    old = finished(backend, 25, at=T0)
    pruner = Pruner(backend, retention_rules(app), batch=10, max_batches=2, pause=0.0)

    first = asyncio.run(pruner.run(now=T0 + 100))
    assert (first.deleted, first.more) == (20, True)
    assert len(kept(backend) & old) == 5
    second = asyncio.run(pruner.run(now=T0 + 100))
    assert (second.deleted, second.more) == (5, False)  # one short batch
    assert kept(backend) == set()


@pytest.mark.needs("results")
def test_dead_jobs_follow_dead_ttl_in_the_same_pass(
    backend: Backend, make_app: Callable[..., Conveyor]
) -> None:
    app = make_app(result_ttl=TTL, dead_ttl=TTL)
    [res] = backend.enqueue_many([new_job(max_attempts=1)], now=T0)
    [job] = backend.claim("default", 1, worker_id="w", lease_s=LEASE, now=T0)
    backend.kill(Lease(job.id, job.lease_token or ""), ErrorInfo("rejected", "made dead for the test"), now=T0)
    finished(backend, 3, at=T0)

    outcome = asyncio.run(Pruner(backend, retention_rules(app), batch=2, pause=0.0).run(now=T0 + 100))

    assert outcome.deleted == 4
    assert backend.get(res.id) is None


@pytest.mark.needs("locks")
def test_only_one_pruner_runs_at_a_time_across_connections(
    backend: Backend, open_store: Callable[[], Backend], make_app: Callable[..., Conveyor]
) -> None:
    app = make_app(result_ttl=TTL)
    other = open_store()  # another worker's connection to the same store
    try:
        old = finished(backend, 30, at=T0)
        held = other.try_lock(PRUNE_LOCK, ttl=60.0)
        assert held is not None
        assert backend.try_lock(PRUNE_LOCK, ttl=60.0) is None
        assert other.try_lock(PRUNE_LOCK, ttl=60.0) is None  # not re-entrant either
        assert held.renew()

        pruner = Pruner(backend, retention_rules(app), batch=10, pause=0.0)
        skipped = asyncio.run(pruner.run(now=T0 + 100))
        assert (skipped.deleted, skipped.skipped) == (0, True)
        assert kept(backend) == old

        held.release()
        ran = asyncio.run(pruner.run(now=T0 + 100))
        assert (ran.deleted, ran.skipped) == (30, False)
        # The pass let go of the lock when it finished.
        again = other.try_lock(PRUNE_LOCK, ttl=60.0)
        assert again is not None
        again.release()
    finally:
        other.close()


@pytest.mark.needs("locks")
def test_a_closed_backend_gives_its_lock_back(backend: Backend,
                                              open_store: Callable[[], Backend]) -> None:
    other = open_store()
    try:
        assert other.try_lock(PRUNE_LOCK, ttl=60.0) is not None
    finally:
        other.close()
    mine = backend.try_lock(PRUNE_LOCK, ttl=60.0)
    assert mine is not None
    mine.release()


def test_locks_of_different_names_do_not_exclude_each_other(backend: Backend) -> None:
    a = backend.try_lock("a", ttl=60.0)
    b = backend.try_lock("b", ttl=60.0)
    assert a is not None and b is not None
    a.release()
    b.release()
    assert not a.renew()  # released: no longer held
