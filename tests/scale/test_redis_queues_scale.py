"""Production shape: Redis with thousands of queues, and idle workers facing a held-back head
(issue 32 items 4 and 5). A private redis-server, so INFO commandstats (calls and microseconds
of EVALSHA, as Redis counts them) are this test's alone.

Every queue holds a job scheduled far ahead, a job running on a far lease and a job that
succeeded recently, and a few are due: reap, promote and prune must cost what is due, not what
the queue set holds. Then 16 idle workers, with retention on, face a queue whose 2,000 waiting
jobs a concurrency limit holds back. The assertions are on counts (keys a call carries, jobs
deleted, script calls per worker and second), never on time; the figures are reported."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from scalekit import report, size
from support import new_job, running_worker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "redis"))
from redisrig import RedisServer

from conveyor import Conveyor, JobState
from conveyor.backends import open_backend
from conveyor.backends.base import Lease
from conveyor.backends.redis import SWEEP_PER_REAP, RedisBackend
from conveyor.backends.redis.keys import QUEUE_KEYS, STORE_KEYS

QUEUES = size(2_000, 30_000)
CALLS = 20
WORKERS = 16
IDLE_S = size(3.0, 10.0)
DUE = 100  # finished jobs past their retention, one in each of as many queues
RETENTION_S = 3600.0


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path, appendonly=False).start()
    try:
        yield srv
    finally:
        srv.stop()


def evalsha(server: RedisServer) -> tuple[int, int]:
    """(calls, microseconds) of the scripts Redis ran so far."""
    stats = server.client().info("commandstats")
    calls = usec = 0
    for name in ("cmdstat_evalsha", "cmdstat_eval"):
        if name in stats:
            calls += int(stats[name]["calls"])
            usec += int(stats[name]["usec"])
    return calls, usec


def keys_per_call(backend: RedisBackend) -> list[int]:
    sizes: list[int] = []
    real = backend._script

    def counted(name: str, keys: Any, args: Any) -> Any:
        sizes.append(len(keys))
        return real(name, keys, args)

    backend._script = counted  # type: ignore[method-assign]
    return sizes


@pytest.mark.timeout(3600)
def test_redis_maintenance_and_idle_load_with_many_queues(server: RedisServer) -> None:
    backend = open_backend(server.url)
    assert isinstance(backend, RedisBackend)
    try:
        old = time.time() - 2 * RETENTION_S
        for start in range(0, QUEUES, 500):
            names = [f"q{i}" for i in range(start, min(QUEUES, start + 500))]
            backend.enqueue_many([replace(new_job(queue=q), delay=3600) for q in names]
                                 + [new_job(queue=q) for q in names] * 2)
            acks = []
            for q in names:
                first, _ = backend.claim(q, 2, worker_id="far", lease_s=3600)
                acks.append((Lease(first.id, first.lease_token or ""), None))
            assert all(backend.ack_many(acks))
        for i in range(DUE):
            backend.enqueue_many([new_job(queue=f"q{i}")], now=old)
            [c] = backend.claim(f"q{i}", 1, worker_id="far", lease_s=3600, now=old)
            backend.ack(Lease(c.id, c.lease_token or ""), None, now=old + i)
        backend.reap()  # this backend's first maintenance calls: the one look over the store
        backend.promote()
        backend.prune(older_than=RETENTION_S, states=(JobState.CANCELLED,))
        sizes = keys_per_call(backend)
        before = evalsha(server)
        for _ in range(CALLS):
            assert backend.reap().count == 0
        mid = evalsha(server)
        for _ in range(CALLS):
            assert backend.promote() == 0
        after = evalsha(server)
        maintenance_keys = max(sizes)
        sizes.clear()
        # One retention batch: the due jobs, among a finished job in every queue.
        assert backend.prune(older_than=RETENTION_S) == DUE
        pruned = evalsha(server)
        prune_usec, prune_keys = pruned[1] - after[1], max(sizes)
        assert backend.prune(older_than=RETENTION_S) == 0
        prune_idle_usec = evalsha(server)[1] - pruned[1]
        reap_calls, reap_usec = mid[0] - before[0], mid[1] - before[1]
        promote_calls, promote_usec = after[0] - mid[0], after[1] - mid[1]

        # Idle load: a head of 2,000 jobs held back by a concurrency key whose one slot a worker
        # elsewhere holds, and 16 idle workers on that queue.
        limited = replace(new_job(queue="held"), concurrency_key="K", concurrency_limit=1)
        backend.enqueue_many([limited] * 2000)
        assert backend.claim("held", 1, worker_id="far", lease_s=3600)
        # Retention on: every worker takes its turn at prune passes (nothing is due).
        app = Conveyor(server.url, result_ttl=RETENTION_S)
        try:
            with contextlib.ExitStack() as stack:
                for _ in range(WORKERS):
                    stack.enter_context(running_worker(app, queues=["held"], concurrency=1, poll_interval=1.0,
                                                       maintenance_interval=1.0))
                time.sleep(1.0)  # started and idle
                idle_before = evalsha(server)
                started = time.monotonic()
                time.sleep(IDLE_S)
                seconds = time.monotonic() - started
                idle_after = evalsha(server)
        finally:
            app.close()
        idle_calls = idle_after[0] - idle_before[0]
        idle_usec = idle_after[1] - idle_before[1]
        report("redis_many_queues", "redis", queues=QUEUES,
               reap_usec_per_call=round(reap_usec / CALLS), reap_scripts_per_call=reap_calls / CALLS,
               promote_usec_per_call=round(promote_usec / CALLS), promote_scripts_per_call=promote_calls / CALLS,
               max_keys_per_script=maintenance_keys, prune_usec_per_call=prune_usec,
               prune_deleted=DUE, prune_keys=prune_keys, prune_idle_usec=prune_idle_usec,
               idle_workers=WORKERS,
               idle_script_calls_per_s=round(idle_calls / seconds, 1),
               idle_redis_ms_per_s=round(idle_usec / seconds / 1000, 2))
        # With nothing due, a reap is its own call plus a sweep slice, a promote one call.
        # (The header and a queue's block are as long as keys.py makes them: a new store key,
        # such as job.wait's, lengthens the header.)
        assert maintenance_keys <= len(STORE_KEYS) + len(QUEUE_KEYS) * 20, maintenance_keys
        # A prune carries the blocks of the due jobs' queues and its slice, not every queue's.
        assert prune_keys <= len(STORE_KEYS) + len(QUEUE_KEYS) * (DUE + SWEEP_PER_REAP), prune_keys
        assert idle_calls <= WORKERS * 6 * (seconds + 1), (idle_calls, seconds)
    finally:
        backend.close()
