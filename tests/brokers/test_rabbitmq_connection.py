"""RabbitMQ's connection: a forked child makes its own and leaves the parent's alone, and a
connection that cannot be made is the same error whatever pika raised."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Callable, Iterator

import pytest
from brokerkit import PARAMS, RABBITMQ_URL, Broker, wait_for
from brokerstores import rabbitmq_prefix
from support import collect, forked

from conveyor import StoreError, StoreUnavailable
from conveyor.backends import open_backend
from conveyor.backends.base import Backend, Lease, NewJob
from conveyor.backends.broker import rabbitmq
from conveyor.backends.broker.transport import Lane

Open = Callable[[], Backend]
REPORT_WITHIN_S = 30.0  # only a hung child takes this long; it is killed then


def job(n: int, queue: str = "q") -> NewJob:
    return NewJob(task="t.work", queue=queue, args=json.dumps({"n": n}), max_attempts=5,
                  timeout=30.0)


def run_all(b: Backend, broker: Broker, queue: str, ids: set[int]) -> list[int]:
    """Claim and ack until every job of ``ids`` ran; the ids handed out, in order."""
    got: list[int] = []

    def more() -> bool:
        batch = b.claim(queue, 10, worker_id="w", lease_s=broker.lease_s)
        assert all(b.ack_many([(Lease(j.id, j.lease_token), None) for j in batch]))
        got.extend(j.id for j in batch)
        return set(got) >= ids

    wait_for(more)
    return got


@pytest.mark.parametrize("broker", [p for p in PARAMS if p.startswith("rabbitmq")],
                         indirect=True)
def test_a_forked_child_opens_its_own_connection(open_broker: Open, broker: Broker) -> None:
    b = open_broker()
    mine = {r.id for r in b.enqueue_many([job(0)])}
    assert b.wait_for_jobs(["q"], 5.0)  # consuming, and the pump thread serves the connection
    inherited = b.transport._conn  # type: ignore[attr-defined]
    # A thread of the parent publishes while it forks: the socket is busy with its frames.
    stop = threading.Event()
    produced: list[int] = []

    def produce() -> None:
        while not stop.is_set():
            produced.extend(r.id for r in b.enqueue_many([job(1, "busy")]))

    producer = threading.Thread(target=produce)
    producer.start()

    def child() -> list[int]:
        queue = f"child{os.getpid()}"
        ids = {r.id for r in b.enqueue_many([job(n, queue) for n in range(5)])}
        ran = run_all(b, broker, queue, ids)
        assert b.transport._conn is not inherited  # type: ignore[attr-defined]
        assert sorted(ran) == sorted(ids)
        return ran

    try:
        children = [forked(child) for _ in range(2)]
        ran_in_children = [i for ran in collect(children, REPORT_WITHIN_S) for i in ran]
    finally:
        stop.set()
        producer.join()
    assert len(ran_in_children) == 10
    # The parent's connection was neither used nor closed by the children: it goes on.
    assert b.transport._conn is inherited  # type: ignore[attr-defined]
    assert sorted(run_all(b, broker, "q", mine)) == sorted(mine)
    assert sorted(run_all(b, broker, "busy", set(produced))) == sorted(produced)


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that takes TCP connections and never says a word (a hung broker)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        yield int(server.getsockname()[1])


def test_a_handshake_timeout_is_store_unavailable(
        silent_server: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rabbitmq, "RETRY_BUDGET", 1.0)
    b = open_backend(f"amqp://guest:guest@127.0.0.1:{silent_server}/%2F?stack_timeout=0.3"
                     f"&prefix=ct{os.getpid()}")
    try:
        with pytest.raises(StoreUnavailable, match="unreachable"):
            b.enqueue_many([job(0)])
        with pytest.raises(StoreUnavailable, match="unreachable"):
            b.claim("q", 1, worker_id="w", lease_s=30)
    finally:
        b.close()


@pytest.mark.parametrize("broker", [p for p in PARAMS if p.startswith("rabbitmq")],
                         indirect=True)
def test_a_batch_with_a_message_no_queue_takes_fails(open_broker: Open, broker: Broker) -> None:
    """A batch is published, then its confirms awaited together: a message the broker
    returned (its lane was deleted behind the transport's back) still fails the enqueue."""
    import pika

    b = open_broker()
    b.enqueue_many([job(0), job(0, "gone")])  # both lanes declared by this transport
    gone = b.transport.name(Lane("gone", 0))  # type: ignore[attr-defined]
    conn = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
    try:
        conn.channel().queue_delete(gone)
    finally:
        conn.close()
    batch = [*(job(n) for n in range(3)), job(3, "gone"), *(job(n) for n in range(4, 7))]
    with pytest.raises(StoreError, match="did not take"):
        b.enqueue_many(batch)
    # The transport goes on: the next batch is taken whole.
    assert len(b.enqueue_many([job(n) for n in range(7, 10)])) == 3


def test_the_dead_lane_has_no_delivery_limit_on_rabbitmq_4() -> None:
    """RabbitMQ 4 gives a quorum queue a delivery limit of 20 unless told otherwise, and every
    dead-lane listing gives its messages back (a delivery): without ``-1`` the 21st listing
    drops every dead job. RabbitMQ 3 has no default limit and reads -1 as "drop at the first
    give-back", so the argument goes to 4 only. Job lanes keep their own limit on both."""
    t = rabbitmq.RabbitTransport(RABBITMQ_URL, prefix="ctver")  # never connects
    try:
        dead, lane = Lane("q", None), Lane("q", 0)
        t.server_major = 4
        assert t._lane_args(dead)["x-delivery-limit"] == -1
        assert t._lane_args(lane)["x-delivery-limit"] == t.delivery_limit
        t.server_major = 3
        assert "x-delivery-limit" not in t._lane_args(dead)
        assert t._lane_args(lane)["x-delivery-limit"] == t.delivery_limit
    finally:
        t.close()


def test_the_version_is_read_at_the_handshake() -> None:
    with rabbitmq_prefix() as prefix:
        t = rabbitmq.RabbitTransport(RABBITMQ_URL, prefix=prefix)
        try:
            assert t.server_major == 0  # not connected yet
            assert t.depth(Lane("q", None)).ready == 0  # declares the dead lane: connected
            assert t.server_major >= 3  # the queues are quorum queues: 3.8 or later
        finally:
            t.close()
