"""Production shape: Redis with thousands of queues, and idle workers facing a held-back head
(issue 32 items 4 and 5). A private redis-server, so INFO commandstats (calls and microseconds
of EVALSHA, as Redis counts them) are this test's alone.

Every queue holds a job scheduled far ahead and a job running on a far lease, and a few are
due: reap and promote must cost what is due, not what the queue set holds. Then 16 idle
workers face a queue whose 2,000 waiting jobs a concurrency limit holds back. The assertions
are on counts (keys a call carries, script calls per worker and second), never on time; the
figures are reported."""

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

from conveyor import Conveyor
from conveyor.backends import open_backend
from conveyor.backends.redis import RedisBackend
from conveyor.backends.redis.keys import QUEUE_KEYS, STORE_KEYS

QUEUES = size(2_000, 30_000)
CALLS = 20
WORKERS = 16
IDLE_S = size(3.0, 10.0)


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
        for start in range(0, QUEUES, 500):
            names = [f"q{i}" for i in range(start, min(QUEUES, start + 500))]
            backend.enqueue_many([replace(new_job(queue=q), delay=3600) for q in names]
                                 + [new_job(queue=q) for q in names])
            for q in names:
                assert backend.claim(q, 1, worker_id="far", lease_s=3600)
        backend.reap()  # this backend's first maintenance call: the one look over the store
        backend.promote()
        sizes = keys_per_call(backend)
        before = evalsha(server)
        for _ in range(CALLS):
            assert backend.reap().count == 0
        mid = evalsha(server)
        for _ in range(CALLS):
            assert backend.promote() == 0
        after = evalsha(server)
        maintenance_keys = max(sizes)
        backend.prune(older_than=3600)
        pruned = evalsha(server)
        prune_usec = pruned[1] - after[1]
        reap_calls, reap_usec = mid[0] - before[0], mid[1] - before[1]
        promote_calls, promote_usec = after[0] - mid[0], after[1] - mid[1]

        # Idle load: a head of 2,000 jobs held back by a concurrency key whose one slot a worker
        # elsewhere holds, and 16 idle workers on that queue.
        limited = replace(new_job(queue="held"), concurrency_key="K", concurrency_limit=1)
        backend.enqueue_many([limited] * 2000)
        assert backend.claim("held", 1, worker_id="far", lease_s=3600)
        # No retention passes: they go over every queue (a separate matter), and would hide
        # what the held-back head costs.
        app = Conveyor(server.url, result_ttl=0)
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
               max_keys_per_script=maintenance_keys, prune_usec_per_call=prune_usec, idle_workers=WORKERS,
               idle_script_calls_per_s=round(idle_calls / seconds, 1),
               idle_redis_ms_per_s=round(idle_usec / seconds / 1000, 2))
        # With nothing due, a reap is its own call plus a sweep slice, a promote one call.
        # (The header and a queue's block are as long as keys.py makes them: a new store key,
        # such as job.wait's, lengthens the header.)
        assert maintenance_keys <= len(STORE_KEYS) + len(QUEUE_KEYS) * 20, maintenance_keys
        assert idle_calls <= WORKERS * 6 * (seconds + 1), (idle_calls, seconds)
    finally:
        backend.close()
