"""Claims made from the worker's event loop (conveyor/backends/redis/loop_claims.py): the plain round
trip on the loop, and every unusual case handed to the blocking code, with the same outcome as
RedisBackend.ack_and_claim. Each test runs on a private redis-server."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from redisrig import RedisServer
from support import WorkerThread, running_worker, wait_for_job

from conveyor import Conveyor, JobState
from conveyor.backends import open_backend
from conveyor.backends.base import Lease, NewJob
from conveyor.backends.redis import RedisBackend
from conveyor.backends.redis.loop_claims import RedisLoopClaims
from conveyor.errors import StoreUnavailable
from conveyor.job import Job

BUSY_LUA = """
local t = redis.call('TIME')
local until_us = tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[1])
repeat t = redis.call('TIME') until tonumber(t[1]) * 1000000 + tonumber(t[2]) >= until_us
return 1
"""


def new_job(i: int = 0) -> NewJob:
    return NewJob(task="t", queue="default", args=json.dumps({"i": i}), max_attempts=3, timeout=30.0)


def open_redis(url: str) -> RedisBackend:
    b = open_backend(url)
    assert isinstance(b, RedisBackend)
    return b


def claims_of(backend: RedisBackend) -> RedisLoopClaims:
    lc = backend.loop_claims()
    assert isinstance(lc, RedisLoopClaims)
    return lc


def call(lc: RedisLoopClaims, acks: list[tuple[Lease, str | None]], limit: int) -> tuple[bool, Any]:
    """One ack_and_claim from an event loop: (made on the loop?, its result or the blocking
    remainder's, run here as the worker runs it on a store thread)."""
    got = asyncio.run(lc.ack_and_claim(acks, "default", limit, worker_id="w", lease_s=30))
    if callable(got):
        return False, got()
    return True, got


def leases(jobs: list[Job]) -> list[tuple[Lease, str | None]]:
    return [(Lease(j.id, j.lease_token or ""), json.dumps(j.id)) for j in jobs]


def connected(backend: RedisBackend, lc: RedisLoopClaims) -> None:
    """The first call has no connection: it claims the blocking way and connects for the next.
    (Its two jobs are acked with ack_many, so the server has every script the loop sends:
    NOSCRIPT is a test of its own.)"""
    on_loop, (held, jobs) = call(lc, [], 2)
    assert not on_loop and held == [] and len(jobs) == 2
    assert backend.ack_many([(Lease(j.id, j.lease_token or ""), None) for j in jobs]) == [True, True]


def test_a_claim_from_the_loop_gives_what_the_blocking_claim_gives(backend: RedisBackend) -> None:
    backend.enqueue_many([new_job(i) for i in range(8)])
    lc = claims_of(backend)
    try:
        connected(backend, lc)
        on_loop, (held, first) = call(lc, [], 3)
        assert on_loop and held == [] and len(first) == 3
        on_loop, (held, second) = call(lc, leases(first), 3)
        assert on_loop and held == [True, True, True] and len(second) == 3
        for j in first:
            stored = backend.get(j.id)
            assert stored is not None and stored.state is JobState.SUCCEEDED and stored.result == j.id
        for j in second:
            assert j == backend.get(j.id)  # every field, the lease token too
    finally:
        lc.close()


def test_a_blocking_claim_no_longer_wanted_writes_its_acks_and_claims_nothing(backend: RedisBackend) -> None:
    """A worker that begins to stop while its claim waits for a store thread (no connection on
    the loop yet) writes its acks and takes no jobs it would only give back."""
    backend.enqueue_many([new_job(i) for i in range(4)])
    lc = claims_of(backend)
    try:
        first = backend.claim("default", 2, worker_id="w", lease_s=30)
        stopping = {"now": False}
        got = asyncio.run(lc.ack_and_claim(leases(first), "default", 2, worker_id="w", lease_s=30,
                                           wanted=lambda: not stopping["now"]))
        assert callable(got)  # no connection yet: the rest is for a store thread
        stopping["now"] = True
        held, claimed = got()
        assert held == [True, True] and claimed == []
        for j in first:
            stored = backend.get(j.id)
            assert stored is not None and stored.state is JobState.SUCCEEDED
        assert backend.stats().queues[0].available == 2
        # Still wanted (and connected by the call above): claims as before, from the loop.
        on_loop, (held, second) = call(lc, [], 2)
        assert on_loop and held == [] and len(second) == 2
    finally:
        lc.close()


def test_packed_claims_are_the_commands_hiredis_packs_whole(backend: RedisBackend) -> None:
    # _pack keeps each call's head (EVALSHA, sha, keys) packed; the bytes sent must stay those
    # of packing every command whole, for acks and claims, on any queue, cached or not.
    import hiredis

    from conveyor.backends.redis.codec import _tokens

    lc = claims_of(backend)
    scripts = backend._transport.scripts
    for name in ("ack_many", "claim"):
        scripts[name].sha = scripts[name].sha or "0" * 40
    acks: list[tuple[Lease, str | None]] = [(Lease(7, "a" * 32), "null"),
                                            (Lease(9, "b" * 32), None)]
    for queue, limit in [("default", 8), ("other", 3), ("default", 8), ("default", 1)]:
        calls = backend._claim_calls(acks, queue, limit, "host:1:abc", 30.0, None,
                                     _tokens(limit), None)
        whole = b"".join(hiredis.pack_command(("EVALSHA", scripts[n].sha, len(k), *k, *a))
                         for n, k, a in calls)
        assert lc._pack(calls) == whole
    assert lc._pack([]) == b""


def test_an_ack_whose_lease_is_gone_is_refused_on_the_loop_too(backend: RedisBackend) -> None:
    backend.enqueue_many([new_job(i) for i in range(4)])
    lc = claims_of(backend)
    try:
        connected(backend, lc)
        [j] = backend.claim("default", 1, worker_id="w", lease_s=30)
        stale = (Lease(j.id, "0" * 32), None)
        on_loop, (held, jobs) = call(lc, [stale, *leases([j])], 1)
        assert on_loop and held == [False, True] and len(jobs) == 1
    finally:
        lc.close()


def test_a_connection_the_server_closed_is_noticed_before_anything_is_sent(
    backend: RedisBackend, private_redis: RedisServer
) -> None:
    backend.enqueue_many([new_job(i) for i in range(6)])
    lc = claims_of(backend)
    admin = private_redis.client()
    try:
        connected(backend, lc)
        on_loop, (_, first) = call(lc, [], 2)
        assert on_loop
        admin.execute_command("CLIENT", "KILL", "SKIPME", "yes")  # the loop's connection, and the pool's
        time.sleep(0.05)
        on_loop, (held, second) = call(lc, leases(first), 2)
        assert not on_loop and held == [True, True] and len(second) == 2
        on_loop, (held, _) = call(lc, leases(second), 1)  # connected again by the call before
        assert on_loop and held == [True, True]
    finally:
        admin.close()
        lc.close()


def test_reconnecting_reuses_one_connection_of_the_pool(backend: RedisBackend, private_redis: RedisServer) -> None:
    """A worker whose connection is dropped again and again connects the same connection object
    again: it does not make one per drop (each would count against max_connections until closed)."""
    backend.enqueue_many([new_job(i) for i in range(30)])
    lc = claims_of(backend)
    admin = private_redis.client()
    try:
        connected(backend, lc)
        objects = set(backend._transport.made)
        for _ in range(5):
            admin.execute_command("CLIENT", "KILL", "SKIPME", "yes")
            time.sleep(0.05)
            on_loop, (_, jobs) = call(lc, [], 1)
            assert not on_loop and len(jobs) == 1  # noticed, claimed the blocking way, connected again
            on_loop, (_, jobs) = call(lc, [], 1)
            assert on_loop and len(jobs) == 1
        # The killed connections of the blocking claims are connected again in place too.
        assert lc._own in objects and backend._transport.made - objects == set()
    finally:
        admin.close()
        lc.close()


def test_no_claims_from_the_loop_over_tls() -> None:
    """TLS records do not map onto the loop's socket reads: those workers claim on a thread
    (no server is needed: nothing connects until a call)."""
    tls = RedisBackend("rediss://127.0.0.1:1/0")
    plain = RedisBackend("redis://127.0.0.1:1/0")
    try:
        assert tls.loop_claims() is None
        assert isinstance(plain.loop_claims(), RedisLoopClaims)
    finally:
        tls.close()
        plain.close()


def test_a_closed_loop_claims_does_not_connect_again(backend: RedisBackend) -> None:
    backend.enqueue_many([new_job(i) for i in range(4)])
    lc = claims_of(backend)
    connected(backend, lc)
    lc.close()
    on_loop, (_, jobs) = call(lc, [], 1)
    assert not on_loop and len(jobs) == 1 and lc._sock is None


def test_noscript_on_the_loop_takes_the_careful_path(backend: RedisBackend, private_redis: RedisServer) -> None:
    backend.enqueue_many([new_job(i) for i in range(6)])
    lc = claims_of(backend)
    admin = private_redis.client()
    try:
        connected(backend, lc)
        on_loop, (_, first) = call(lc, [], 2)
        admin.script_flush()
        on_loop, (held, second) = call(lc, leases(first), 2)
        assert not on_loop and held == [True, True] and len(second) == 2
        assert admin.script_exists(backend._transport.scripts["ack_many"].sha, backend._transport.scripts["claim"].sha) == [True, True]
        on_loop, (held, _) = call(lc, leases(second), 1)
        assert on_loop and held == [True, True]
    finally:
        admin.close()
        lc.close()


def busy(private_redis: RedisServer, us: int) -> Callable[[], None]:
    """Keep the server busy in a script for ``us`` microseconds; returns the join."""
    admin = private_redis.client()
    t = threading.Thread(target=lambda: admin.eval(BUSY_LUA, 0, us), daemon=True)
    t.start()
    time.sleep(0.1)

    def join() -> None:
        t.join(10)
        admin.close()

    return join


def test_a_reply_lost_after_sending_checks_each_ack(private_redis: RedisServer) -> None:
    """The scripts were sent, the reply does not come within the socket timeout: the acks may
    have landed (here they do, once the busy server reads them), so each is checked, and the
    call reports the store unreachable. The next call connects again."""
    b = open_redis(private_redis.url + "&socket_timeout=0.3")
    b.enqueue_many([new_job(i) for i in range(6)])
    lc = claims_of(b)
    try:
        connected(b, lc)
        on_loop, (_, first) = call(lc, [], 2)
        assert on_loop
        join = busy(private_redis, 800_000)
        got = asyncio.run(lc.ack_and_claim(leases(first), "default", 2, worker_id="w", lease_s=30))
        assert callable(got)
        with pytest.raises(StoreUnavailable, match="2 of 2 acks written"):
            got()
        join()
        for j in first:
            assert b.get(j.id).state is JobState.SUCCEEDED  # type: ignore[union-attr]
        on_loop, _ = call(lc, [], 1)
        assert not on_loop  # the connection was dropped: its reply would be read as the next call's
    finally:
        lc.close()
        b.close()


def test_a_claim_cancelled_on_the_loop_drops_its_connection(backend: RedisBackend,
                                                             private_redis: RedisServer) -> None:
    backend.enqueue_many([new_job(i) for i in range(4)])
    lc = claims_of(backend)
    try:
        connected(backend, lc)
        join = busy(private_redis, 500_000)

        async def cancel_midway() -> None:
            task = asyncio.ensure_future(lc.ack_and_claim([], "default", 1, worker_id="w", lease_s=30))
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(cancel_midway())
        assert lc._sock is None
        join()
    finally:
        lc.close()


def test_a_single_queue_worker_claims_from_its_loop(private_redis: RedisServer,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's claims go through RedisLoopClaims (a change that sent them back to a store
    thread would cost a quarter of the drain rate and pass every other test)."""
    trips = {"loop": 0}
    real = RedisLoopClaims._read

    async def counted(self: RedisLoopClaims, n: int) -> Any:
        trips["loop"] += 1
        return await real(self, n)

    monkeypatch.setattr(RedisLoopClaims, "_read", counted)
    app = Conveyor(private_redis.url)
    try:
        @app.task(name="add")
        def add(a: int, b: int) -> int:
            return a + b

        handles = [add.enqueue(i, 1) for i in range(40)]
        with running_worker(app, concurrency=2):
            assert [wait_for_job(app, h.id).result for h in handles] == [i + 1 for i in range(40)]
        assert trips["loop"] > 0
    finally:
        app.close()


def test_a_worker_on_weighted_queues_claims_from_its_loop(private_redis: RedisServer,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Each queue's claim of a weighted worker's round goes through RedisLoopClaims too, and
    the round still passes a queue's unused share on: every job of both queues runs, and no
    claim is made on a store thread once the loop has its connection."""
    queues_on_loop: list[str] = []
    real_claim = RedisLoopClaims.ack_and_claim
    blocking = {"claims": 0}
    real_blocking = RedisBackend.claim
    real_blocking_acks = RedisBackend.ack_and_claim
    asked_if_wanted: list[bool] = []

    async def counted(self: RedisLoopClaims, acks: Any, queue: str, limit: int, **kw: Any) -> Any:
        asked_if_wanted.append(callable(kw.get("wanted")))
        got = await real_claim(self, acks, queue, limit, **kw)
        if not callable(got):
            queues_on_loop.append(queue)
        return got

    def counted_blocking(self: RedisBackend, *args: Any, **kw: Any) -> Any:
        blocking["claims"] += 1
        return real_blocking(self, *args, **kw)

    def counted_blocking_acks(self: RedisBackend, *args: Any, **kw: Any) -> Any:
        blocking["claims"] += 1
        return real_blocking_acks(self, *args, **kw)

    monkeypatch.setattr(RedisLoopClaims, "ack_and_claim", counted)
    monkeypatch.setattr(RedisBackend, "claim", counted_blocking)
    monkeypatch.setattr(RedisBackend, "ack_and_claim", counted_blocking_acks)
    app = Conveyor(private_redis.url)
    try:
        @app.task(name="bulk_add", queue="bulk")
        def bulk_add(a: int, b: int) -> int:
            return a + b

        @app.task(name="urgent_add", queue="urgent")
        def urgent_add(a: int, b: int) -> int:
            return a + b

        # Many in "bulk" and few in "urgent": once "urgent" runs dry its share goes to "bulk".
        handles = [bulk_add.enqueue(i, 1) for i in range(60)]
        handles += [urgent_add.enqueue(i, 2) for i in range(5)]
        with running_worker(app, concurrency=4, queues="urgent:3,bulk:1"):
            results = [wait_for_job(app, h.id).result for h in handles]
            claims_before_stop = blocking["claims"]
        assert results == [i + 1 for i in range(60)] + [i + 2 for i in range(5)]
        assert {"bulk", "urgent"} <= set(queues_on_loop)
        assert asked_if_wanted and all(asked_if_wanted)  # a stopping worker's fallback claims nothing
        # The first claim connects the loop's socket the blocking way; the idle waiter claims
        # on its own thread. Busy rounds, with acks or without, do not: far fewer blocking
        # claims than loop ones.
        assert claims_before_stop < len(queues_on_loop)
    finally:
        app.close()


# -- claims sent ahead (Worker._send_ahead) -----------------------------------------------------

def test_a_claim_sent_from_the_reply_hook_is_read_by_finish(backend: RedisBackend) -> None:
    """claim_ahead sends at once, from on_reply (the socket is free as soon as a reply is in),
    and finish reads what ack_and_claim would have: its acks held, its own jobs."""
    backend.enqueue_many([new_job(i) for i in range(9)])
    lc = claims_of(backend)
    try:
        connected(backend, lc)  # 7 left
        _, (_, first) = call(lc, [], 2)
        sent: list[Any] = []
        told: list[int] = []

        def hook(got: int) -> None:
            told.append(got)
            sent.append(lc.claim_ahead(leases(first), "default", 3, worker_id="w", lease_s=30))

        async def both() -> tuple[Any, Any]:
            got = await lc.ack_and_claim([], "default", 2, worker_id="w", lease_s=30, on_reply=hook)
            assert told == [2] and sent[0] is not None
            return got, await lc.finish(sent[0], on_reply=told.append)

        (held1, second), (held2, third) = asyncio.run(both())
        assert told == [2, 3]
        assert held1 == [] and len(second) == 2
        assert held2 == [True, True] and len(third) == 3
        assert len({j.id for j in first + second + third}) == 7
        for j in first:
            stored = backend.get(j.id)
            assert stored is not None and stored.state is JobState.SUCCEEDED and stored.result == j.id
        for j in third:
            assert j == backend.get(j.id)  # running, with the lease token the reply gave
        assert backend.stats().queues[0].available == 0
    finally:
        lc.close()


def test_a_claim_ahead_without_a_connection_sends_nothing(backend: RedisBackend) -> None:
    backend.enqueue_many([new_job(i) for i in range(2)])
    lc = claims_of(backend)
    try:
        assert lc.claim_ahead([], "default", 2, worker_id="w", lease_s=30) is None
        [q] = backend.stats().queues
        assert q.running == 0 and q.available == 2
    finally:
        lc.close()


def _short_jobs(app: Conveyor, n: int) -> list[Any]:
    @app.task(name="double")
    def double(i: int) -> int:
        return 2 * i

    return double.enqueue_many([(i,) for i in range(n)])


def _count_ahead(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    sent = {"ahead": 0}
    real = RedisLoopClaims.claim_ahead

    def counted(self: RedisLoopClaims, *args: Any, **kw: Any) -> Any:
        got = real(self, *args, **kw)
        sent["ahead"] += got is not None
        return got

    monkeypatch.setattr(RedisLoopClaims, "claim_ahead", counted)
    return sent


def test_a_prefetching_worker_sends_claims_ahead_and_runs_every_job_once(
    private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Short jobs, prefetch = concurrency: claims go out ahead, and still every job runs once
    and the store never sees more than concurrency + prefetch jobs leased to the worker."""
    sent = _count_ahead(monkeypatch)
    app = Conveyor(private_redis.url)
    peak = {"leased": 0}
    watching = threading.Event()

    def watch() -> None:
        while not watching.is_set():
            running = sum(q.running for q in app.backend.stats(finished=False).queues)
            peak["leased"] = max(peak["leased"], running)

    try:
        jobs = _short_jobs(app, 600)
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            with running_worker(app, concurrency=4, prefetch=4) as wt:
                done = [wait_for_job(app, j.id, timeout=30) for j in jobs]
        finally:
            watching.set()
            watcher.join()
        assert [j.state for j in done] == [JobState.SUCCEEDED] * 600
        assert [j.result for j in done] == [2 * i for i in range(600)]
        assert all(j.attempts == 1 for j in done)
        assert wt.worker.counters.claimed == 600
        assert sent["ahead"] > 0, "no claim was sent ahead"
        assert 0 < peak["leased"] <= 4 + 4
    finally:
        app.close()


def test_no_claims_ahead_without_prefetch(private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without prefetch a claim ahead could take only part of the slots: none is sent."""
    sent = _count_ahead(monkeypatch)
    app = Conveyor(private_redis.url)
    try:
        jobs = _short_jobs(app, 200)
        with running_worker(app, concurrency=4):
            assert all(wait_for_job(app, j.id).state is JobState.SUCCEEDED for j in jobs)
        assert sent["ahead"] == 0
    finally:
        app.close()


def test_a_stop_while_a_claim_ahead_is_out_releases_its_jobs_unrun(
    private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stop comes while a claim sent ahead waits for its reply: the worker still reads it,
    and gives its jobs back unrun, rather than leave them leased until the lease runs out."""
    real = RedisLoopClaims.finish
    box: dict[str, Any] = {}

    async def stop_first(self: RedisLoopClaims, ahead: Any, on_reply: Any = None) -> Any:
        if "stopped" not in box:
            box["stopped"] = ahead.limit
            # What a signal handler's callback does, here at once: stop() only schedules it, and
            # a reply already in the socket is read without a turn of the loop to run it.
            box["wt"].worker._request_stop()
        return await real(self, ahead, on_reply)

    monkeypatch.setattr(RedisLoopClaims, "finish", stop_first)
    app = Conveyor(private_redis.url)
    try:
        jobs = _short_jobs(app, 400)
        wt = box["wt"] = WorkerThread(app, concurrency=4, prefetch=4)
        wt.start()
        wt.join()
        assert "stopped" in box, "no claim was sent ahead"
        states = [app.get_job(j.id) for j in jobs]
        assert not [j.id for j in states if j.state is JobState.RUNNING]
        assert all(j.attempts == 0 for j in states if j.state is JobState.AVAILABLE)
        assert wt.worker.counters.released >= box["stopped"]  # the claim ahead's jobs at least
        assert sum(j.state is JobState.SUCCEEDED for j in states) == wt.worker.counters.succeeded
    finally:
        app.close()


def test_a_claim_ahead_whose_reply_is_lost_is_settled_carefully(
    private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection breaks before a claim sent ahead is read: its acks are checked one by one,
    the jobs it claimed unseen are given back by its claim id, uncounted, and every job still
    runs once."""
    real_finish, real_read = RedisLoopClaims.finish, RedisLoopClaims._read
    box = {"broken": 0, "reading_ahead": False}

    async def finish(self: RedisLoopClaims, ahead: Any, on_reply: Any = None) -> Any:
        box["reading_ahead"] = True
        try:
            return await real_finish(self, ahead, on_reply)
        finally:
            box["reading_ahead"] = False

    async def read(self: RedisLoopClaims, n: int) -> Any:
        replies = await real_read(self, n)  # the claim ran: its jobs are leased to us, unseen
        if box["reading_ahead"] and not box["broken"]:
            box["broken"] += 1
            raise redis.ConnectionError("connection lost (test)")
        return replies

    monkeypatch.setattr(RedisLoopClaims, "finish", finish)
    monkeypatch.setattr(RedisLoopClaims, "_read", read)
    app = Conveyor(private_redis.url)
    try:
        jobs = _short_jobs(app, 200)
        with running_worker(app, concurrency=4, prefetch=4, visibility_timeout=1.0) as wt:
            done = [wait_for_job(app, j.id, timeout=30) for j in jobs]
        assert box["broken"] == 1
        # The acks it carried were settled by the careful path, not sent again (then refused,
        # and their jobs reported as leases lost).
        assert wt.worker.counters.succeeded == 200
        assert [(j.id, j.state) for j in done if j.state is not JobState.SUCCEEDED] == []
        assert [j.result for j in done] == [2 * i for i in range(200)]
        # The lost claim's jobs were given back unrun (release_claim), not charged an attempt.
        assert [j.id for j in done if (j.attempts, j.stalls) != (1, 0)] == []
    finally:
        app.close()
