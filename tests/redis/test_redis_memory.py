"""Redis under memory pressure: job hashes gone from under their indexes (an evicting
maxmemory-policy, or a key deleted by hand), and writes refused at maxmemory.

Each test runs on a private redis-server (see conftest.py), never the shared one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from redisrig import RedisServer

from conveyor import JobState
from conveyor.backends import open_backend
from conveyor.backends.base import Lease, NewJob
from conveyor.backends.redis import RedisBackend

T0 = 1_700_000_000.0


def job(queue: str = "default", **kw: Any) -> NewJob:
    return NewJob(task="t", queue=queue, args="{}", max_attempts=3, timeout=30.0, **kw)


@pytest.fixture
def backend(private_redis: RedisServer) -> Iterator[RedisBackend]:
    b = open_backend(private_redis.url)
    assert isinstance(b, RedisBackend)
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def admin(private_redis: RedisServer) -> Iterator[Any]:
    c = private_redis.client()
    try:
        yield c
    finally:
        c.close()


def evict(admin: Any, server: RedisServer, job_id: int) -> None:
    """What an evicting maxmemory-policy does to a job: its hash is gone, its index entries stay."""
    assert admin.delete(f"{{{server.prefix}}}:job:{job_id}") == 1


def missing(admin: Any, server: RedisServer, queue: str) -> int:
    return int(admin.hget(f"{{{server.prefix}}}:expiries", f"missing/{queue}") or 0)


def indexed(admin: Any, server: RedisServer, job_id: int) -> list[str]:
    """The keys of this app whose members name the job (sorted sets of ids)."""
    found = []
    for key in admin.scan_iter(f"{{{server.prefix}}}:*"):
        if admin.type(key) == "zset" and admin.zscore(key, str(job_id)) is not None:
            found.append(key)
    return found


@pytest.mark.parametrize("plain", [True, False], ids=["enqueue_one", "enqueue"])
def test_a_claim_batch_skips_a_job_whose_hash_is_gone(backend: RedisBackend, admin: Any,
                                                     private_redis: RedisServer, plain: bool) -> None:
    extra = {} if plain else {"fair_key": "k"}
    ids = [backend.enqueue_many([job(**extra)], now=T0)[0].id for _ in range(5)]
    evict(admin, private_redis, ids[1])
    got = backend.claim("default", 5, worker_id="w", lease_s=30, now=T0)
    assert [j.id for j in got] == [ids[0], *ids[2:]]
    assert all(j.task == "t" and j.state is JobState.RUNNING for j in got)
    # Each claimed job has its own lease: the tokens line up with the jobs after the gap.
    for j in got:
        backend.ack(Lease(j.id, j.lease_token or ""), None, now=T0 + 1)
    assert admin.exists(f"{{{private_redis.prefix}}}:job:{ids[1]}") == 0  # no partial hash written
    assert indexed(admin, private_redis, ids[1]) == []
    assert missing(admin, private_redis, "default") == 1
    assert backend.get(ids[1]) is None
    [q] = backend.stats(now=T0 + 1).queues
    assert (q.available, q.running, q.succeeded) == (0, 0, 4)


def test_reap_skips_a_running_job_whose_hash_is_gone(backend: RedisBackend, admin: Any,
                                                    private_redis: RedisServer) -> None:
    backend.enqueue_many([job(), job(), job()], now=T0)
    got = backend.claim("default", 3, worker_id="w", lease_s=30, now=T0)
    evict(admin, private_redis, got[1].id)
    reaped = backend.reap(now=T0 + 100)
    assert reaped.requeued == sorted([got[0].id, got[2].id]) and reaped.dead == []
    assert indexed(admin, private_redis, got[1].id) == []
    assert missing(admin, private_redis, "default") == 1
    assert backend.reap(now=T0 + 100).count == 0
    assert [j.id for j in backend.claim("default", 3, worker_id="w", lease_s=30, now=T0 + 101)] == \
        [got[0].id, got[2].id]


def test_promotion_skips_a_scheduled_job_whose_hash_is_gone(backend: RedisBackend, admin: Any,
                                                           private_redis: RedisServer) -> None:
    ids = [r.id for r in backend.enqueue_many([job(delay=10), job(delay=10), job(delay=10)], now=T0)]
    evict(admin, private_redis, ids[0])
    assert backend.promote(now=T0 + 20) == 2
    evict(admin, private_redis, ids[1])
    assert [j.id for j in backend.claim("default", 3, worker_id="w", lease_s=30, now=T0 + 20)] == [ids[2]]
    for i in ids[:2]:
        assert admin.exists(f"{{{private_redis.prefix}}}:job:{i}") == 0
        assert indexed(admin, private_redis, i) == []
    assert missing(admin, private_redis, "default") == 2
