"""The Redis backend's own connections over a process's life: every connection the idle closer
shuts is given back to the count the cap is checked against, so churn never uses it up.

Each test runs on a private redis-server (see conftest.py), never the shared one."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from redisrig import RedisServer, wait_until

import conveyor.backends.redis.transport as redis_transport
from conveyor.backends.base import NewJob
from conveyor.backends.redis import RedisBackend


def job(queue: str = "default") -> NewJob:
    return NewJob(task="t", queue=queue, args="{}", max_attempts=3, timeout=30.0)


def burst(backend: RedisBackend, threads: int, calls: int, *, wait: bool = False) -> int:
    """``threads`` threads released at once, each making ``calls`` enqueues (after an idle wait
    of 20 ms with ``wait``, which holds a blocking connection per thread at the same time, so
    the burst needs one each, however the threads are scheduled); asserts none failed."""
    together = threading.Barrier(threads)
    failed: list[BaseException] = []

    def run() -> None:
        together.wait()
        try:
            if wait:
                backend.wait_and_claim(["idle"], 0.02, [("idle", 1)], worker_id="w", lease_s=30)
            for _ in range(calls):
                backend.enqueue_many([job()])
        except Exception as exc:  # counted, and shown by the assertion
            failed.append(exc)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert not failed, failed[:3]
    return threads * calls


def ours(admin: Any, name: str) -> int:
    return sum(1 for c in admin.client_list() if c.get("name") == name)


def test_connections_churned_far_past_the_cap_are_given_back(private_redis: RedisServer,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """With the idle closer closing every connection idle at all (all but the last used), each
    burst of threads makes connections and the next checkins close them: 25 times the cap over
    the backend's life. Before, every one stayed counted in redis-py's pool and the backend
    was stuck once the cap was reached ("Too many connections")."""
    monkeypatch.setattr(redis_transport, "IDLE_CLOSE_S", 0.0)
    cap, name = 8, f"churn-{uuid.uuid4().hex[:8]}"
    backend = RedisBackend(f"{private_redis.url}&max_connections={cap}&client_name={name}")
    admin = private_redis.client()

    def made() -> int:
        return int(admin.info("stats")["total_connections_received"])

    try:
        start, rounds = made(), 0
        # Each round needs a new blocking connection for 3 of its 4 threads (the idle closer
        # left one): some 60 rounds. Before, the count stopped at the cap, and the rounds went
        # on by waiting for each other's connections (the "5.5 s instead of 0.27 s").
        while made() - start < 25 * cap and rounds < 300:
            burst(backend, 4, 3, wait=True)
            rounds += 1
        assert made() - start >= 25 * cap, f"connections stopped being made at {made() - start}"
        # After all of it, a burst as wide as the cap still gets a connection per thread.
        assert burst(backend, cap, 5) == 5 * cap
        [q] = [q for q in backend.stats().queues if q.queue == "default"]
        assert q.available == rounds * 3 * 4 + 5 * cap
        # The server sees a closed socket on its next turn: wait for it to agree, then compare.
        wait_until(lambda: backend.open_connections() == ours(admin, name), 10, "the server's client list")
        assert backend.open_connections() <= cap + 1  # + the pooled one of stats()
    finally:
        backend.close()
        admin.close()


def test_closing_the_backend_closes_every_connection(private_redis: RedisServer) -> None:
    name = f"close-{uuid.uuid4().hex[:8]}"
    backend = RedisBackend(f"{private_redis.url}&client_name={name}")
    admin = private_redis.client()
    try:
        burst(backend, 3, 2)
        backend.wait_for_jobs(["other"], 0.01)
        wait_until(lambda: backend.open_connections() == ours(admin, name), 10, "the server's client list")
        assert backend.open_connections() >= 2
        backend.close()
        assert backend.open_connections() == 0
        wait_until(lambda: ours(admin, name) == 0, 10, "the server to see every connection closed")
    finally:
        admin.close()
