"""SqsTransport with ``fifo=true`` against moto's server: FIFO lanes, message groups,
deduplication ids, and delays through each lane's standard delay queue.

Where moto differs from SQS (see docs/backends.md, "FIFO queues"): moto deduplicates only
against messages still in the queue (SQS: any sent in the last 5 minutes, deleted or not), and
answers a duplicate with a new MessageId (SQS: the first message's). The tests below keep to
what both do.

Conditions are awaited by polling with a deadline (support.wait_until), never by fixed sleeps.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from support import wait_until

from conveyor.backends.broker import sqs
from conveyor.backends.broker.sqs import SqsTransport
from conveyor.backends.broker.sqs_settings import parse_sqs_url
from conveyor.backends.broker.transport import Delivery, Lane, Outgoing

LANE = Lane("jobs", 0)


@pytest.fixture
def fifo(sqs_url: str) -> Iterator[SqsTransport]:
    t = SqsTransport(parse_sqs_url(f"{sqs_url}&fifo=true"))
    try:
        yield t
    finally:
        t.close()


def bodies(deliveries: list[Delivery]) -> list[bytes]:
    return [d.body for d in deliveries]


def receive_soon(t: SqsTransport, lane: Lane = LANE, n: int = 1) -> list[Delivery]:
    got: list[Delivery] = []

    def more() -> bool:
        got.extend(t.receive(lane, n - len(got), lease_s=30))
        return len(got) >= n

    wait_until(more, timeout=15, message=f"{n} message(s) to be receivable")
    return got


def test_fifo_supports_unique_and_fair(fifo: SqsTransport, transport: SqsTransport) -> None:
    assert fifo.supports == {"unique", "fair"}
    assert transport.supports == frozenset()


def test_lanes_are_fifo_queues_with_a_fifo_dead_lane_and_a_standard_delay_queue(
        fifo: SqsTransport, sqs_client: Any) -> None:
    fifo.publish([Outgoing(LANE, b"x")])
    prefix = fifo.settings.prefix

    def attributes(name: str) -> dict[str, str]:
        url = sqs_client.get_queue_url(QueueName=name)["QueueUrl"]
        found: dict[str, str] = sqs_client.get_queue_attributes(
            QueueUrl=url, AttributeNames=["All"])["Attributes"]
        return found

    lane = attributes(f"{prefix}-jobs-p0.fifo")
    assert lane["FifoQueue"] == "true" and lane["ContentBasedDeduplication"] == "false"
    policy = json.loads(lane["RedrivePolicy"])
    assert policy["deadLetterTargetArn"].endswith(f"{prefix}-jobs-dead.fifo")
    assert attributes(f"{prefix}-jobs-dead.fifo")["FifoQueue"] == "true"
    assert attributes(f"{prefix}-jobs-p0-delay").get("FifoQueue", "false") == "false"
    assert fifo.queues() == ["jobs"]


def test_a_duplicate_deduplication_id_is_dropped(fifo: SqsTransport) -> None:
    fifo.publish([Outgoing(LANE, b"first", dedup_id="key:k")])
    fifo.publish([Outgoing(LANE, b"second", dedup_id="key:k"),
                  Outgoing(LANE, b"other", dedup_id="key:j")])
    got = receive_soon(fifo, n=2)
    assert sorted(bodies(got)) == [b"first", b"other"]
    assert fifo.receive(LANE, 10, lease_s=30) == []
    assert fifo.settle(got) == [True, True]


def test_ids_of_any_length_and_characters_are_accepted(fifo: SqsTransport) -> None:
    # SQS takes 128 characters at most, from a set: the transport sends a digest.
    odd = "ключ / with spaces\n" * 20
    fifo.publish([Outgoing(LANE, b"a", dedup_id=odd, group=odd),
                  Outgoing(LANE, b"b", dedup_id=odd + "2", group=odd)])
    got = receive_soon(fifo, n=2)
    assert bodies(got) == [b"a", b"b"]  # one group: in order


def test_a_group_is_served_in_order_one_hand_out_at_a_time(fifo: SqsTransport) -> None:
    fifo.publish([Outgoing(LANE, f"a{i}".encode(), group="tenant-a") for i in range(3)])
    fifo.publish([Outgoing(LANE, f"b{i}".encode(), group="tenant-b") for i in range(3)])
    [first] = fifo.receive(LANE, 1, lease_s=30)
    assert first.body == b"a0"
    # While a0 is held, tenant a's next jobs wait; tenant b is served.
    [other] = fifo.receive(LANE, 1, lease_s=30)
    assert other.body == b"b0"
    assert fifo.receive(LANE, 10, lease_s=30) == []
    fifo.settle([first])
    [second] = receive_soon(fifo)
    assert second.body == b"a1"
    fifo.settle([other, second])
    rest = receive_soon(fifo, n=2)
    assert sorted(bodies(rest)) == [b"a2", b"b1"]


def test_messages_without_a_group_are_not_serialised(fifo: SqsTransport) -> None:
    fifo.publish([Outgoing(LANE, str(i).encode()) for i in range(3)])
    held = [fifo.receive(LANE, 1, lease_s=30) for _ in range(3)]
    assert sorted(b for one in held for b in bodies(one)) == [b"0", b"1", b"2"]


def test_a_delayed_message_waits_in_the_delay_queue(fifo: SqsTransport) -> None:
    fifo.publish([Outgoing(LANE, b"later", delay=1.5)])
    assert fifo.receive(LANE, 1, lease_s=30) == []
    depth = fifo.depth(LANE)
    assert (depth.ready, depth.delayed) == (0, 1)
    [d] = receive_soon(fifo)
    assert (d.body, d.deliveries, d.lane) == (b"later", 1, LANE)
    assert fifo.settle([d]) == [True]
    depth = fifo.depth(LANE)
    assert (depth.ready, depth.in_flight, depth.delayed) == (0, 0, 0)


def test_a_delayed_message_keeps_its_group(fifo: SqsTransport) -> None:
    fifo.publish([Outgoing(LANE, b"now", group="g")])
    fifo.publish([Outgoing(LANE, b"later", group="g", delay=1)])
    [now] = fifo.receive(LANE, 1, lease_s=30)
    # Due, and moved into the lane, it still waits behind the held message of its group.
    wait_until(lambda: fifo.depth(LANE).delayed == 0 and fifo.receive(LANE, 1, lease_s=30) == []
               and fifo.depth(LANE).ready == 1, timeout=15, message="the delayed one moved")
    assert fifo.settle([now]) == [True]
    [later] = receive_soon(fifo)
    assert later.body == b"later"


def test_a_delayed_message_keeps_its_deduplication_id(fifo: SqsTransport) -> None:
    fifo.publish([Outgoing(LANE, b"one", dedup_id="k", delay=1)])
    fifo.publish([Outgoing(LANE, b"two", dedup_id="k", delay=1)])
    [d] = receive_soon(fifo)
    assert d.body == b"one"
    wait_until(lambda: fifo.depth(LANE).delayed == 0, timeout=15,
               message="the delay queue emptied")
    assert fifo.receive(LANE, 10, lease_s=30) == []


def test_delay_past_max_delay_is_held_max_delay(fifo: SqsTransport) -> None:
    fifo.publish([Outgoing(LANE, b"much later", delay=86_400)])
    assert fifo.receive(LANE, 1, lease_s=30) == []
    assert fifo.depth(LANE).delayed == 1


def test_wait_wakes_for_a_delayed_message(fifo: SqsTransport) -> None:
    lanes = [Lane("jobs", 0), Lane("jobs", 1)]
    assert fifo.wait(lanes, 0.2) is False
    fifo.publish([Outgoing(Lane("jobs", 1), b"y", delay=1)])
    assert fifo.wait(lanes, 10) is True
    [d] = fifo.receive(Lane("jobs", 1), 1, lease_s=30)
    assert d.body == b"y"


def test_dead_lane_and_fencing_work_as_on_standard_queues(fifo: SqsTransport) -> None:
    dead = Lane("jobs", None)
    fifo.publish([Outgoing(dead, str(i).encode()) for i in range(3)])
    got = fifo.receive(dead, 10, lease_s=30)
    assert sorted(bodies(got)) == [b"0", b"1", b"2"]
    fifo.give_back(got)
    assert fifo.purge(dead) == 3
    fifo.publish([Outgoing(LANE, b"x", group="g")])
    [first] = fifo.receive(LANE, 1, lease_s=1)
    [second] = receive_soon(fifo)  # its lease ran out: handed out again
    assert second.deliveries == 2
    assert fifo.settle([first, second]) == [False, True]


def test_fifo_and_standard_lanes_of_one_prefix_are_apart(sqs_url: str) -> None:
    url = sqs_url.replace("prefix=t", "prefix=v")
    standard = SqsTransport(parse_sqs_url(url))
    fifo = SqsTransport(parse_sqs_url(f"{url}&fifo=true"))
    try:
        fifo.publish([Outgoing(Lane("fifo-only", 0), b"x")])
        standard.publish([Outgoing(Lane("standard-only", 0), b"x")])
        assert fifo.queues() == ["fifo-only"]
        assert standard.queues() == ["standard-only"]
    finally:
        standard.close()
        fifo.close()


def test_a_move_whose_delete_was_lost_is_dropped_as_a_duplicate(
        fifo: SqsTransport, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that dies between a move's send and its delete leaves the delayed message to
    come back in its delay queue; the next move sends it with the same deduplication id, and
    SQS drops it."""
    monkeypatch.setattr(sqs, "PUMP_HOLD", 1)
    fifo.publish([Outgoing(LANE, b"once", delay=1)])
    delete = fifo._client.delete_message_batch
    lost: list[str] = []

    def lose_the_delete(QueueUrl: str, Entries: list[dict[str, str]]) -> dict[str, Any]:
        if QueueUrl.endswith("-delay"):
            lost.extend(e["Id"] for e in Entries)  # answered, never done: as if it died
            return {"Successful": [{"Id": e["Id"]} for e in Entries], "Failed": []}
        result: dict[str, Any] = delete(QueueUrl=QueueUrl, Entries=Entries)
        return result

    monkeypatch.setattr(fifo._client, "delete_message_batch", lose_the_delete)
    wait_until(lambda: fifo._pump(LANE, now=True), timeout=15, message="the first move")
    monkeypatch.setattr(fifo._client, "delete_message_batch", delete)
    # Back in the delay queue after PUMP_HOLD, and moved again.
    wait_until(lambda: fifo._pump(LANE, now=True), timeout=15, message="the second move")
    assert lost and fifo.depth(LANE).delayed == 0
    [d] = fifo.receive(LANE, 10, lease_s=30)
    assert d.body == b"once"
    assert fifo.receive(LANE, 10, lease_s=30) == []
