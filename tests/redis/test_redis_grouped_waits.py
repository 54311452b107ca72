"""An idle worker on the queues of many partitions waits through one subscribed connection per
node (backends/redis/wakes.py), not a blocking connection and a thread per partition; every
way a wake-up could be lost ends the wait instead of leaving it asleep."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redisrig import RedisServer
from stores import REDIS_URL, BackendUnavailable, redis_store
from support import collect, forked, new_job

from conveyor.backends import open_backend
from conveyor.backends.redis import wakes
from conveyor.backends.redis.partitions import PartitionedRedis, queue_partition

N = 16


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[PartitionedRedis]:
    try:
        with redis_store(tmp_path, partitions=N) as url:
            b = open_backend(url)
            assert isinstance(b, PartitionedRedis)
            try:
                yield b
            finally:
                b.close()
    except BackendUnavailable as exc:
        pytest.skip(str(exc))  # the conformance run says so for CI


def one_per_partition(n: int = N) -> list[str]:
    """A queue name in each of ``n`` partitions, the i-th in partition i."""
    by_part: dict[int, str] = {}
    i = 0
    while len(by_part) < n:
        by_part.setdefault(queue_partition(f"q{i}", n), f"q{i}")
        i += 1
    return [by_part[p] for p in range(n)]


class Wait:
    """``backend.wait_for_jobs`` on a thread: ``result`` once it returns."""

    def __init__(self, backend: PartitionedRedis, queues: list[str], timeout: float,
                 verify: bool = True) -> None:
        self.result: bool | BaseException | None = None
        self.started = time.monotonic()
        self.took = 0.0

        def run() -> None:
            try:
                self.result = backend.wait_for_jobs(queues, timeout, verify=verify)
            except BaseException as exc:
                self.result = exc
            self.took = time.monotonic() - self.started

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self, timeout: float = 10) -> bool | BaseException | None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the wait did not return"
        return self.result


def clients(prefix_cmd: str) -> list[dict[str, Any]]:
    r = redis.Redis.from_url(REDIS_URL)
    try:
        return [c for c in r.client_list() if c.get("cmd") == prefix_cmd]
    finally:
        r.close()


def settle(backend: PartitionedRedis, subscribed: int) -> None:
    deadline = time.monotonic() + 5
    while backend._hub.subscriptions() < subscribed:
        assert time.monotonic() < deadline, "the wake channels were never confirmed"
        time.sleep(0.01)
    time.sleep(0.2)  # past the first look, asleep


@pytest.mark.parametrize("verify", [True, False])
def test_one_connection_waits_on_every_partition_and_a_job_ends_the_wait(
        backend: PartitionedRedis, verify: bool) -> None:
    queues = one_per_partition()
    blocked_before = len(clients("blpop"))
    wait = Wait(backend, queues, timeout=20, verify=verify)
    settle(backend, N)
    assert backend._hub.connections() == 1
    # No blocking pop per partition (there were N of them, one a thread): the other tests'
    # waits on the shared server may block meanwhile, but none of these.
    assert len(clients("blpop")) <= blocked_before
    backend.enqueue_many([new_job(queue=queues[-1])])
    assert wait.join() is True
    assert wait.took < 10


def test_a_wait_sees_a_job_that_came_before_it_and_sleeps_through_other_queues(
        backend: PartitionedRedis) -> None:
    queues = one_per_partition()
    backend.enqueue_many([new_job(queue="elsewhere")])
    assert backend.wait_for_jobs(queues, 0.5) is False  # not its queue: the timeout
    backend.enqueue_many([new_job(queue=queues[3])])
    assert backend.wait_for_jobs(queues, 5) is True


def subscribers(n: int) -> list[str]:
    """The ids of the connections subscribed to at least ``n`` shard channels."""
    return [c["id"] for c in clients("ssubscribe") if int(c.get("ssub", 0)) >= n]


def kill_subscribers(n: int) -> list[str]:
    r = redis.Redis.from_url(REDIS_URL)
    try:
        ids = subscribers(n)
        for i in ids:
            r.client_kill_filter(_id=i)
    finally:
        r.close()
    return ids


@pytest.mark.parametrize("job_while_down", [True, False])
def test_a_lost_subscriber_is_replaced_and_no_job_is_missed(
        backend: PartitionedRedis, job_while_down: bool) -> None:
    queues = one_per_partition()
    wait = Wait(backend, queues, timeout=30)
    settle(backend, N)
    killed = kill_subscribers(N)
    assert len(killed) == 1
    if job_while_down:  # published to nobody: the look after subscribing again finds it
        backend.enqueue_many([new_job(queue=queues[0])])
    else:
        deadline = time.monotonic() + 10
        while not [i for i in subscribers(N) if i not in killed]:
            assert time.monotonic() < deadline, "no new subscriber"
            time.sleep(0.01)
        settle(backend, N)
        assert wait.result is None  # subscribed again, still waiting
        backend.enqueue_many([new_job(queue=queues[-1])])
    assert wait.join() is True
    assert wait.took < 10


def test_partitions_left_unsubscribed_are_waited_on_their_wake_lists(
        backend: PartitionedRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    queues = one_per_partition()
    half = {queue_partition(q, N) for q in queues[: N // 2]}
    real = wakes.WakeHub._subscribe

    def partly(hub: wakes.WakeHub, wanted: dict[int, list[str]]) -> set[int]:
        return real(hub, wanted) - half  # as if half were never confirmed

    monkeypatch.setattr(wakes.WakeHub, "_subscribe", partly)
    wait = Wait(backend, queues, timeout=20)
    time.sleep(0.5)
    backend.enqueue_many([new_job(queue=queues[0])])  # an unsubscribed partition's
    assert wait.join() is True
    assert wait.took < 10
    wait = Wait(backend, queues, timeout=20)
    time.sleep(0.5)
    backend.enqueue_many([new_job(queue=queues[-1])])  # a subscribed one's
    assert wait.join() is True
    assert wait.took < 10


def test_wake_and_close_end_a_grouped_wait(backend: PartitionedRedis) -> None:
    queues = one_per_partition()
    wait = Wait(backend, queues, timeout=30)
    settle(backend, N)
    backend.wake()
    assert wait.join() is True
    wait = Wait(backend, queues, timeout=30)
    settle(backend, N)
    backend.close()
    assert wait.join() is True
    assert wait.took < 10


def test_a_scheduled_job_coming_due_ends_the_wait(backend: PartitionedRedis) -> None:
    queues = one_per_partition()
    now = backend.now()
    backend.enqueue_many([new_job(queue=queues[5], run_at=now + 1.0)])
    started = time.monotonic()
    assert backend.wait_for_jobs(queues, 20) is True
    assert time.monotonic() - started < 10


def test_a_user_without_channel_rights_waits_on_the_lists(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Redis 7 gives a new ACL user no channel rights: the wake-ups are not published and
    subscribing is refused, so grouped waits fall back to the wake lists (no loop of
    refused subscriptions), and every write still succeeds."""
    server = RedisServer(tmp_path).start()
    admin = server.client()
    admin.acl_setuser("app", enabled=True, passwords=["+apppw"],
                      keys=["{" + server.prefix + "#*"], commands=["+@all", "-@dangerous"])
    admin.close()
    url = f"redis://app:apppw@127.0.0.1:{server.port}/0?prefix={server.prefix}&partitions={N}"
    b = open_backend(url)
    assert isinstance(b, PartitionedRedis)
    queues = one_per_partition()
    try:
        b.enqueue_many([new_job(queue=q) for q in queues])  # publishing refused, quietly
        for q in queues:
            assert len(b.claim(q, 10, worker_id="w", lease_s=30)) == 1
        for _ in range(2):  # the second after the refusal: straight to the lists
            wait = Wait(b, queues, timeout=20)
            time.sleep(1.5)
            assert wait.result is None
            b.enqueue_many([new_job(queue=queues[7])])
            assert wait.join() is True
            assert wait.took < 10
            b.claim(queues[7], 10, worker_id="w", lease_s=30)
        assert b._hub.connections() == 0
        assert "refused a subscription" in caplog.text
    finally:
        b.close()
        server.stop()


def test_a_forked_child_subscribes_on_its_own_and_leaves_the_parents_alone(
        backend: PartitionedRedis) -> None:
    """gunicorn --preload, multiprocessing's fork: the child inherits the parent's subscriber
    (its socket, its reader thread gone). It makes its own; the parent's keeps working."""
    queues = one_per_partition()
    assert backend.wait_for_jobs(queues, 0.3) is False  # the parent has subscribed
    assert backend._hub.connections() == 1
    parent_ids = set(subscribers(N))

    def child() -> list[Any]:
        assert backend._hub.connections() == 0  # the parent's, forgotten
        woken = backend.wait_for_jobs(queues, 0.5)
        return [woken, backend._hub.connections(), backend._hub.subscriptions()]

    [(woken, conns, subs)] = collect([forked(child)], within=30)
    assert (woken, conns, subs) == (False, 1, N)
    assert parent_ids <= set(subscribers(N))  # the parent's subscriber is still there
    wait = Wait(backend, queues, timeout=20)
    settle(backend, N)
    backend.enqueue_many([new_job(queue=queues[9])])
    assert wait.join() is True
    assert wait.took < 10


def test_a_look_over_many_partitions_is_one_write_per_node(
        backend: PartitionedRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    queues = one_per_partition()
    backend.enqueue_many([new_job(queue=q) for q in (queues[1], queues[12])])
    sent: list[int] = []
    one_by_one: list[str] = []
    transport_cls = type(backend.parts[0]._transport)
    real_send, real_look = transport_cls.send_scripts, type(backend.parts[0])._look

    def counting_send(self: Any, calls: Any, **kw: Any) -> Any:
        sent.append(len(calls))
        return real_send(self, calls, **kw)

    def counting_look(self: Any, mode: str, qs: Any) -> Any:
        one_by_one.append(mode)
        return real_look(self, mode, qs)

    monkeypatch.setattr(transport_cls, "send_scripts", counting_send)
    monkeypatch.setattr(type(backend.parts[0]), "_look", counting_look)
    assert backend.ready_queues(queues) == [queues[1], queues[12]]
    assert sent == [N] and one_by_one == []
    # A script the server lost (a restart, SCRIPT FLUSH) is loaded again; the refused looks
    # are made one by one meanwhile, with the same answer.
    r = redis.Redis.from_url(REDIS_URL)
    try:
        r.script_flush()
    finally:
        r.close()
    sent.clear()
    assert backend.ready_queues(queues) == [queues[1], queues[12]]
    assert sent[0] == N and len(one_by_one) == N
