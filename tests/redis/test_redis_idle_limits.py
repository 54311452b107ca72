"""A queue whose waiting jobs a concurrency or rate limit holds back costs Redis one bounded
walk per hold, not a walk per idle worker per poll (issue 32 item 5): the claim records until
when nothing can run ('hold'), later claims answer at once, and idle workers sleep until then
or a wake-up. Counted in script calls and entries walked, never in time."""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from typing import Any

import pytest
from redisrig import RedisServer
from support import T0, new_job, running_worker

from conveyor import Conveyor
from conveyor.backends.base import CLAIM_SCAN, Lease, NewJob
from conveyor.backends.redis import RedisBackend


def limited(limit: int = 1, queue: str = "default") -> NewJob:
    return replace(new_job(queue=queue), concurrency_key="K", concurrency_limit=limit)


def rated(limit: int, period: float) -> NewJob:
    return replace(new_job(), rate_key="R", rate_limit=limit, rate_period=period)


def claim_replies(backend: RedisBackend) -> list[Any]:
    """The reply of every claim script call the backend makes from now on."""
    replies: list[Any] = []
    real = backend._script

    def recorded(name: str, keys: Any, args: Any) -> Any:
        reply = real(name, keys, args)
        if name == "claim":
            replies.append(reply)
        return reply

    backend._script = recorded  # type: ignore[method-assign]
    return replies


def walked(reply: Any) -> int:
    assert reply[0] == "hold", reply
    return int(reply[2])


def test_a_held_back_head_is_walked_once_until_a_slot_frees(backend: RedisBackend) -> None:
    backend.enqueue_many([limited()] * 2000, now=T0)
    [first] = backend.claim("default", 1, worker_id="w", lease_s=3600, now=T0)
    replies = claim_replies(backend)
    for k in range(20):
        assert backend.claim("default", 4, worker_id="w", lease_s=30, now=T0 + 1 + k / 100) == []
    assert 0 < walked(replies[0]) <= CLAIM_SCAN
    assert [walked(r) for r in replies[1:]] == [0] * 19
    backend.ack(Lease(first.id, first.lease_token or ""), None, now=T0 + 2)
    [second] = backend.claim("default", 4, worker_id="w", lease_s=30, now=T0 + 2)
    assert second.id == first.id + 1


def test_a_rate_limited_head_is_held_until_its_window_ends(backend: RedisBackend) -> None:
    backend.enqueue_many([rated(2, 60.0)] * 500, now=T0)
    assert len(backend.claim("default", 5, worker_id="w", lease_s=30, now=T0)) == 2
    replies = claim_replies(backend)
    assert backend.claim("default", 5, worker_id="w", lease_s=30, now=T0 + 1) == []
    assert float(replies[0][1]) == pytest.approx(T0 + 60.0, abs=1e-3)
    assert backend.claim("default", 5, worker_id="w", lease_s=30, now=T0 + 59) == []
    assert walked(replies[1]) == 0
    assert len(backend.claim("default", 5, worker_id="w", lease_s=30, now=T0 + 60.5)) == 2


def test_a_new_job_ends_the_hold(backend: RedisBackend) -> None:
    backend.enqueue_many([limited()] * 10, now=T0)
    assert len(backend.claim("default", 5, worker_id="w", lease_s=3600, now=T0)) == 1
    assert backend.claim("default", 5, worker_id="w", lease_s=30, now=T0 + 1) == []
    [plain] = backend.enqueue_many([new_job()], now=T0 + 1)
    assert [j.id for j in backend.claim("default", 5, worker_id="w", lease_s=30, now=T0 + 1)] == [plain.id]


def commandstats(server: RedisServer) -> dict[str, int]:
    """Calls per command so far."""
    info = server.client().info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items()}


def test_idle_workers_with_a_held_back_head_do_not_poll(private_redis: RedisServer) -> None:
    app = Conveyor(private_redis.url)
    try:
        app.backend.enqueue_many([limited()] * 2000)
        # The one slot of the key is taken, by a worker elsewhere that runs for a long time.
        assert app.backend.claim("default", 1, worker_id="elsewhere", lease_s=3600)
        workers = 4
        with contextlib.ExitStack() as stack:
            for _ in range(workers):
                stack.enter_context(running_worker(app, concurrency=2, poll_interval=1.0, maintenance_interval=1.0))
            time.sleep(1.0)  # started and idle
            before = commandstats(private_redis)
            started = time.monotonic()
            time.sleep(3.0)
            seconds = time.monotonic() - started
            after = commandstats(private_redis)
        scripts = sum(after.get(c, 0) - before.get(c, 0) for c in ("evalsha", "eval"))
        # Per idle worker and second about one look (peek) and one claim behind its blocking pop,
        # plus its heartbeat and record_worker and the fleet's one maintenance turn: a bound that
        # holds however slow the machine is. Polling on the held head made it hundreds.
        assert scripts <= workers * 6 * (seconds + 1), (scripts, seconds)
    finally:
        app.close()

