"""RabbitMQ's claims: what a claim returns is held by a live channel, a claim that fails hands
its messages back, a claim takes what the queue has (not only what a consumer pushed), and
messages a consumer took that no claim reads go back to the queue. RabbitMQ alone and with
each companion store (the claim is the core's either way)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
from brokerkit import PARAMS, Broker, wait_for

from conveyor import StoreUnavailable
from conveyor.backends.base import Backend, Lease, NewJob
from conveyor.backends.broker import rabbitmq as rabbitmq_module
from conveyor.backends.broker.message import decode
from conveyor.backends.broker.transport import Lane

Open = Callable[[], Backend]
rabbitmq = pytest.mark.parametrize(
    "broker", [p for p in PARAMS if p.startswith("rabbitmq")], indirect=True)


def job(n: int, **kw: object) -> NewJob:
    base: dict[str, object] = {"task": "t.work", "queue": "q", "args": json.dumps({"n": n}),
                               "max_attempts": 5, "timeout": 30.0}
    base.update(kw)
    return NewJob(**base)  # type: ignore[arg-type]


def claim(b: Backend, broker: Broker, limit: int = 10) -> list:
    return b.claim("q", limit, worker_id="w1", lease_s=broker.lease_s)


def acks(b: Backend, jobs: list) -> list[bool]:
    return b.ack_many([(Lease(j.id, j.lease_token), None) for j in jobs])


def claim_until(b: Backend, broker: Broker, ids: set[int], timeout: float = 15.0) -> list:
    """Claim (and ack) until every job of ``ids`` was handed out; every hand-out, in order."""
    got: list = []

    def more() -> bool:
        batch = claim(b, broker)
        assert all(acks(b, batch)), "a claim returned a job whose lease was gone"
        got.extend(batch)
        return {j.id for j in got} >= ids

    wait_for(more, timeout)
    return got


@rabbitmq
def test_a_claim_returns_no_job_whose_channel_died_during_it(
        open_broker: Open, broker: Broker) -> None:
    """The channel dies after the claim received lane -1 and before it receives lane 1:
    lane -1's messages go back to the broker and are handed out again, so the claim must not
    return them (they would run twice: here, and wherever the broker sends them)."""
    b = open_broker()
    early = {r.id for r in b.enqueue_many([job(n, priority=-1) for n in range(3)])}
    late = {r.id for r in b.enqueue_many([job(n, priority=1) for n in range(3, 6)])}
    transport = b.transport  # type: ignore[attr-defined]
    receive = transport.receive
    lost: list[Lane] = []

    def lose_then_receive(lane: Lane, limit: int, *, lease_s: float) -> list:
        if lane.level == 1 and not lost:
            lost.append(lane)
            broker.lose(b, broker.lease_s)
        return receive(lane, limit, lease_s=lease_s)

    transport.receive = lose_then_receive
    first = claim(b, broker)
    transport.receive = receive
    assert lost
    assert {j.id for j in first} <= late
    assert all(acks(b, first))
    rest = claim_until(b, broker, (early | late) - {j.id for j in first})
    every = [j.id for j in [*first, *rest]]
    assert sorted(every) == sorted(early | late)  # each once
    if broker.companion:
        # The store's lease of a dropped hand-out was given back with it: no attempt lost.
        assert {j.attempts for j in rest} == {1}
        assert all(not b.get(i).errors for i in early)  # type: ignore[union-attr]


@rabbitmq
def test_a_claim_that_fails_hands_its_messages_back(open_broker: Open, broker: Broker) -> None:
    """The claim's second receive fails: what the first one took must not stay held by this
    backend's connection (still open, so the broker would never give it to anyone else)."""
    b = open_broker()
    ids = {r.id for r in b.enqueue_many([job(n, priority=-1) for n in range(3)])}
    b.enqueue_many([job(9, priority=1)])
    transport = b.transport  # type: ignore[attr-defined]
    receive = transport.receive
    calls: list[Lane] = []

    def receive_then_fail(lane: Lane, limit: int, *, lease_s: float) -> list:
        calls.append(lane)
        if len(calls) > 1:
            raise StoreUnavailable("RabbitMQ went away in the middle of the claim")
        return receive(lane, limit, lease_s=lease_s)

    transport.receive = receive_then_fail
    with pytest.raises(StoreUnavailable):
        claim(b, broker)
    transport.receive = receive
    assert b._held == {}  # type: ignore[attr-defined]
    other = open_broker()
    got = claim_until(other, broker, ids)
    assert {j.id for j in got} >= ids
    assert {j.attempts for j in got if j.id in ids} <= {1, 2}  # given back, not lost
    if broker.companion:
        # The store's leases of the failed claim were given back too: no attempt lost.
        assert {j.attempts for j in got if j.id in ids} == {1}
        assert all(not other.get(i).errors for i in ids)  # type: ignore[union-attr]


@rabbitmq
def test_a_claim_right_after_an_enqueue_takes_what_is_there(
        open_broker: Open, broker: Broker) -> None:
    b = open_broker()
    ids = [r.id for r in b.enqueue_many([job(n) for n in range(3)])]
    got = claim(b, broker)
    assert sorted(j.id for j in got) == sorted(ids)
    assert all(acks(b, got))


@rabbitmq
def test_a_later_claim_may_take_more_than_the_first_claims_limit(
        open_broker: Open, broker: Broker) -> None:
    """The consumer's prefetch comes from the first claim (a worker's free slots); a later
    claim with more free slots still gets what it asks for, while the first claim's jobs run."""
    b = open_broker()
    b.enqueue_many([job(n) for n in range(2)])
    running: list = []
    wait_for(lambda: running.extend(claim(b, broker, 2 - len(running))) or len(running) == 2)
    more = {r.id for r in b.enqueue_many([job(n) for n in range(2, 10)])}
    got = claim(b, broker, 8)
    assert {j.id for j in got} == more
    assert all(acks(b, [*running, *got]))


@rabbitmq
def test_messages_a_consumer_took_go_back_when_claims_stop(
        open_broker: Open, broker: Broker) -> None:
    """An app whose worker stopped keeps its consumer until it is closed: what the consumer
    took and no claim read must go back to the queue for other apps' workers, soon."""
    idle = open_broker()
    assert idle.wait_for_jobs(["q"], 0.05) is False  # consuming, as a worker waiting does
    ids = {r.id for r in idle.enqueue_many([job(n) for n in range(3)])}
    wait_for(lambda: idle.wait_for_jobs(["q"], 0.05))  # pushed to the idle app's consumer
    got = claim_until(open_broker(), broker, ids)
    assert {j.id for j in got} == ids
    assert [j.attempts for j in got] == [1, 1, 1]  # handed back uncharged


@rabbitmq
def test_a_job_claimed_before_the_consumers_stop_keeps_its_lease(
        open_broker: Open, broker: Broker) -> None:
    """Cancelling the consumers of an idle app gives back only what no claim took: a job that
    runs meanwhile (a long task on a worker with no free slot) is still this app's."""
    b = open_broker()
    ids = {r.id for r in b.enqueue_many([job(n) for n in range(2)])}
    running: list = []
    wait_for(lambda: running.extend(claim(b, broker, 1)) or running)
    transport = b.transport  # type: ignore[attr-defined]
    wait_for(lambda: not transport._consumers)  # nobody claimed for a while: cancelled
    assert b.heartbeat([Lease(j.id, j.lease_token) for j in running],
                       lease_s=broker.lease_s) == set()
    assert all(acks(b, running))
    rest = claim_until(b, broker, ids - {j.id for j in running})
    assert sorted(j.id for j in [*running, *rest]) == sorted(ids)


@rabbitmq
def test_a_claim_longer_than_the_idle_bound_keeps_its_consumers(
        open_broker: Open, broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """A companion's claim writes each job it hands out to the store, so a claim of many jobs
    can take longer than ``UNCLAIMED_S``. The app is claiming all that time: its consumers must
    not be cancelled mid-claim (that republishes every message they pushed and no claim took
    yet, once per long claim)."""
    b = open_broker()
    ids = {r.id for r in b.enqueue_many([job(n) for n in range(6)])}
    transport = b.transport  # type: ignore[attr-defined]
    assert b.wait_for_jobs(["q"], 5.0)  # consuming
    stops: list[float] = []
    stop = transport._stop_consuming
    monkeypatch.setattr(transport, "_stop_consuming", lambda: (stops.append(1.0), stop()))
    hand_out = b._hand_out  # type: ignore[attr-defined]
    slow = [True]

    def slow_hand_out(*args: object, **kw: object) -> object:
        if slow and slow.pop():  # the first hand-out takes as long as a big claim's would
            time.sleep(rabbitmq_module.UNCLAIMED_S + 2.5 * transport._heartbeat_s)
        return hand_out(*args, **kw)

    monkeypatch.setattr(b, "_hand_out", slow_hand_out)
    got = claim(b, broker, 6)
    assert stops == []
    assert all(acks(b, got))
    claim_until(b, broker, ids - {j.id for j in got})


@rabbitmq
def test_the_first_enqueue_to_a_queue_makes_every_lane_of_it(
        open_broker: Open, broker: Broker) -> None:
    """A worker consuming a lane another connection is still creating crashes its connection
    in RabbitMQ (the quorum queue has no leader yet: 541 INTERNAL_ERROR), and with it go the
    messages it held. So an enqueue makes all of its queue's lanes, not only the one it uses:
    the lanes the workers consume exist before the first job does."""
    import pika

    b = open_broker()
    b.enqueue_many([job(0)])  # priority 0: lane p0
    transport = b.transport  # type: ignore[attr-defined]
    conn = pika.BlockingConnection(transport.params)
    try:
        ch = conn.channel()
        for level in transport.levels:
            # passive: fails (closing the channel) if the queue does not exist
            ch.queue_declare(transport.name(Lane("q", level)), passive=True)
    finally:
        conn.close()


@pytest.mark.parametrize("limit", [1, 2])
@pytest.mark.parametrize("broker", ["rabbitmq"], indirect=True)
def test_a_claim_takes_a_lanes_messages_in_the_order_they_came(
        open_broker: Open, broker: Broker, limit: int) -> None:
    """A message the queue pushed to the consumer whose delivery comes in only after the claim
    looked at the consumer's buffer (here: it looked a moment too early) is ahead, in the lane,
    of what the claim's ``basic.get`` takes: the claim returns it first, and a claim with room
    for one returns it, not the get's (seen under load: a claim of 8 took job 4 before job 3,
    after an ack had freed the consumer's prefetch slot)."""
    b = open_broker()
    ids = [r.id for r in b.enqueue_many([job(n) for n in range(3)])]
    transport = b.transport  # type: ignore[attr-defined]
    lane = Lane("q", 0)
    looked: list[float] = []
    with transport._lock:  # the pump thread would serve the connection meanwhile
        ch = transport._channel()
        transport.prefetch = 1
        transport._consume(ch, lane, 1)  # the queue pushes the first job to the consumer
        conn = transport._conn
        serve = conn.process_data_events

        def too_early(time_limit: float = 0) -> None:
            if looked:
                serve(time_limit)
            else:  # the first look finds nothing: the push is still on its way
                looked.append(time_limit)
                time.sleep(0.3)

        conn.process_data_events = too_early
        try:
            got = transport.receive(lane, limit, lease_s=broker.lease_s)
        finally:
            conn.process_data_events = serve
    assert looked
    assert [decode(d.body).id for d in got] == ids[:limit]
    rest = transport.receive(lane, 3, lease_s=broker.lease_s)
    assert [decode(d.body).id for d in rest] == ids[limit:]
    assert transport.settle([*got, *rest]) == [True] * 3


class _PushesAfterTheGet:
    """A channel on which the consumer's deliveries come in after the reply to a ``basic.get``
    the queue answered empty because it had handed them to the consumer: RabbitMQ's channel
    waits in the get for the queue's answer, and the deliveries the queue sent it before are
    written out only after the get's reply. A later synchronous method's reply comes after
    them (one channel's frames keep their order)."""

    # The get itself, and methods with no reply: none of them brings the deliveries in.
    _NO_REPLY_AFTER = frozenset({"basic_get", "basic_ack", "basic_nack", "basic_reject",
                                 "basic_publish"})

    def __init__(self, ch: object, on_the_way: list[Callable[[], None]]) -> None:
        self._ch, self._on_the_way, self._got_empty = ch, on_the_way, False

    def __getattr__(self, name: str) -> object:
        real = getattr(self._ch, name)
        if not callable(real):
            return real

        def call(*args: object, **kw: object) -> object:
            out = real(*args, **kw)
            if name == "basic_get" and out[0] is None:
                self._got_empty = True
            elif name not in self._NO_REPLY_AFTER and self._got_empty:
                while self._on_the_way:  # in ahead of this reply
                    self._on_the_way.pop(0)()
            return out

        return call


@pytest.mark.parametrize("broker", ["rabbitmq"], indirect=True)
def test_a_claim_takes_what_the_consumer_was_sent_before_the_get_came_back_empty(
        open_broker: Open, broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """The queue handed the lane's messages to the consumer (an ack had freed its prefetch),
    so the claim's ``basic.get`` finds the lane empty, and the deliveries come in only after
    the get's reply: the claim must still return them, not nothing (seen under load: a prune
    test's loop of claims stopped at 3,000 of 3,500 jobs, on a claim that came back empty)."""
    b = open_broker()
    ids = [r.id for r in b.enqueue_many([job(n) for n in range(3)])]
    transport = b.transport  # type: ignore[attr-defined]
    lane = Lane("q", 0)
    on_the_way: list[Callable[[], None]] = []
    deliver = transport._on_message
    monkeypatch.setattr(transport, "_on_message",
                        lambda *a: on_the_way.append(lambda: deliver(*a)))
    with transport._lock:  # the pump thread would serve the connection meanwhile
        ch = transport._channel()
        transport.prefetch = 3
        transport._consume(ch, lane, 3)
        deadline = time.monotonic() + 10
        while len(on_the_way) < 3 and time.monotonic() < deadline:
            transport._conn.process_data_events(0.05)  # the queue handed all three out
        assert len(on_the_way) == 3
        transport._ch = _PushesAfterTheGet(ch, on_the_way)
        try:
            got = transport.receive(lane, 3, lease_s=broker.lease_s)
        finally:
            transport._ch = ch
    assert [decode(d.body).id for d in got] == ids
    assert transport.settle(got) == [True] * 3
