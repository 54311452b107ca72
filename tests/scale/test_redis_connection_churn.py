"""Hours of bursty load on the Redis backend, compressed: connections made and closed far past
the default cap (max_connections 1,024) over one backend's life, then the burst that used to
fail once the cap was used up (64 threads x 20 enqueues). A private redis-server, so the
server's own count of connections received is this test's alone."""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from scalekit import report, size

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "redis"))
from redisrig import RedisServer, wait_until

import conveyor.backends.redis.transport as redis_transport
from conveyor import JobState
from conveyor.backends.base import Lease, NewJob
from conveyor.backends.redis import RedisBackend

THREADS = 16


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path, appendonly=False).start()
    try:
        yield srv
    finally:
        srv.stop()


def test_redis_connection_churn(server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # Idle time compressed to nothing: every checkin closes each connection idle at all but the
    # one used last, so a burst's extra connections are closed at once, as after a quiet spell.
    monkeypatch.setattr(redis_transport, "IDLE_CLOSE_S", 0.0)
    target = size(2_000, 100_000)
    name = f"churn-{uuid.uuid4().hex[:8]}"
    backend = RedisBackend(f"{server.url}&client_name={name}")
    admin = server.client()

    def received() -> int:
        return int(admin.info("stats")["total_connections_received"])

    start = received()
    stop = threading.Event()
    rounds = [0]
    last = [start, 0]  # connections received, and rounds since that count last grew

    def next_round() -> None:  # run by one thread once all have arrived
        rounds[0] += 1
        now = received()
        last[:] = [now, 0] if now > last[0] else [now, last[1] + 1]
        # Stopped also when no round makes a connection any more: the threads then share the
        # few left, as in production once the count was used up, and this would never end.
        if now - start >= target or failures or last[1] >= 200:
            stop.set()

    line = threading.Barrier(THREADS, action=next_round)
    failures: list[BaseException] = []
    enqueued = [0] * THREADS
    purged = [0]

    def producer_and_worker(n: int) -> None:
        while True:
            line.wait()
            if stop.is_set():
                return
            try:
                backend.enqueue_many([NewJob(task="t", queue="churn", args="{}", max_attempts=3, timeout=30.0)])
                enqueued[n] += 1
                for job in backend.claim("churn", 1, worker_id=f"w{n}", lease_s=30):
                    backend.ack(Lease(job.id, job.lease_token or ""), None)
                if n == 0 and rounds[0] % 500 == 0:
                    purged[0] += backend.purge(state=JobState.SUCCEEDED)  # keeps the private server small
            except Exception as exc:  # counted; the assertion shows the first
                failures.append(exc)

    began = time.monotonic()
    threads = [threading.Thread(target=producer_and_worker, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    churn_s = time.monotonic() - began
    made = received() - start

    # The burst that was stuck once the cap was used up: 64 threads x 20 enqueues at once.
    together = threading.Barrier(64)
    burst_failures: list[BaseException] = []

    def burst() -> None:
        together.wait()
        for _ in range(20):
            try:
                backend.enqueue_many([NewJob(task="t", queue="burst", args="{}", max_attempts=3, timeout=30.0)])
            except Exception as exc:
                burst_failures.append(exc)

    began = time.monotonic()
    bursters = [threading.Thread(target=burst) for _ in range(64)]
    for t in bursters:
        t.start()
    for t in bursters:
        t.join()
    burst_s = time.monotonic() - began

    def clients() -> int:
        return sum(1 for c in admin.client_list() if c.get("name") == name)

    try:
        assert not failures, f"{len(failures)} failed after {made} connections: {failures[:3]}"
        wait_until(lambda: backend.open_connections() == clients(), 10, "the server's client list to agree")
        alive = backend.open_connections()
        stats = {q.queue: q for q in backend.stats().queues}
        report("redis_connection_churn", "redis", connections_made=made, rounds=rounds[0], threads=THREADS,
               churn_s=round(churn_s, 1), failures=len(failures), burst_64x20_s=round(burst_s, 2),
               burst_failures=len(burst_failures), alive_at_end=alive, server_clients=clients())
        assert made >= target
        assert not burst_failures, burst_failures[:3]
        assert stats["burst"].available == 64 * 20
        churn = stats["churn"]  # every job enqueued is there, done or waiting, or was purged done
        assert churn.running == 0
        assert churn.available + churn.succeeded + purged[0] == sum(enqueued)
        # What is left open is the last burst's, not the churn's: at most one per burst thread,
        # plus the pooled ones of stats and purge.
        assert alive <= 64 + 2
    finally:
        backend.close()
        admin.close()
