"""Redis under memory pressure: job hashes gone from under their indexes (an evicting
maxmemory-policy, or a key deleted by hand), and writes refused at maxmemory.

Each test runs on a private redis-server (see conftest.py), never the shared one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from redisrig import RedisServer

from conveyor import JobState, StorageFull
from conveyor.backends.base import ErrorInfo, Lease, NewJob
from conveyor.backends.redis import ENQUEUE_CHUNK, OOM_SLACK, RedisBackend

T0 = 1_700_000_000.0


def job(queue: str = "default", **kw: Any) -> NewJob:
    return NewJob(task="t", queue=queue, args="{}", max_attempts=3, timeout=30.0, **kw)


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


# -- at maxmemory ------------------------------------------------------------------------------


def fill_to_maxmemory(backend: RedisBackend, admin: Any) -> None:
    """Give the private server a maxmemory a little above what it uses, then enqueue until Redis
    refuses (noeviction, the setting the docs ask for)."""
    used = int(admin.info("memory")["used_memory"])
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", used + 4 * 1024 * 1024)
    big = json.dumps({"pad": "x" * 60_000})
    with pytest.raises(StorageFull, match="out of memory"):
        for _ in range(10_000):
            backend.enqueue_many([NewJob(task="t", queue="fill", args=big, max_attempts=1, timeout=30.0)])


def test_at_maxmemory_new_data_is_refused_whole_and_jobs_still_finish(
        backend: RedisBackend, admin: Any, private_redis: RedisServer) -> None:
    backend.enqueue_many([job(), job(), job()], now=T0)
    a, b, c = backend.claim("default", 3, worker_id="w", lease_s=300, now=T0)
    fill_to_maxmemory(backend, admin)
    ids_key = f"{{{private_redis.prefix}}}:ids"
    last_id, dbsize = admin.get(ids_key), admin.dbsize()

    # New jobs: refused before anything is written, one job, a batch, or a batch of chunks.
    for batch in ([job()], [job(), job(max_depth=100)], [job()] * (ENQUEUE_CHUNK + 1)):
        with pytest.raises(StorageFull, match="nothing was written"):
            backend.enqueue_many(batch, now=T0)
    # A step record bigger than the slack is new data too: refused whole, the task sees why.
    with pytest.raises(StorageFull, match="record_step refused, nothing was written"):
        backend.record_step(a.id, "big", json.dumps("s" * 5000), uid=a.uid)
    assert admin.get(ids_key) == last_id and admin.dbsize() == dbsize
    assert not admin.hexists(f"{{{private_redis.prefix}}}:job:{a.id}", "step:big")

    # What must not fail goes on: a small step record, an ack, a kill. The kill's traceback is
    # cut to its last lines rather than the kill refused (a refused kill runs the job again).
    assert backend.record_step(a.id, "small", json.dumps("ok"), uid=a.uid) == (True, json.dumps("ok"))
    backend.ack(Lease(a.id, a.lease_token or ""), json.dumps("done"), now=T0 + 1)
    tb = "".join(f"  line {n}\n" for n in range(20_000)) + "ValueError: the end\n"
    backend.kill(Lease(b.id, b.lease_token or ""), ErrorInfo("exception", "boom", "ValueError", tb), now=T0 + 1)
    dead = backend.get(b.id)
    assert dead is not None and dead.state is JobState.DEAD
    [error] = dead.errors
    assert error["message"] == "boom" and error["traceback"].endswith("ValueError: the end\n")
    assert len(error["traceback"]) <= OOM_SLACK and "cut" in error["traceback"]
    # A small traceback is kept whole, at maxmemory too.
    backend.retry(Lease(c.id, c.lease_token or ""), ErrorInfo("exception", "again", "E", "tb\n"), delay=0,
                  now=T0 + 1)
    again = backend.get(c.id)
    assert again is not None and again.errors[0]["traceback"] == "tb\n"
