"""SqsTransport against moto's server: each rule of transport.py's docstring.

Conditions are awaited by polling with a deadline (support.wait_until), never by fixed sleeps.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from support import wait_until

from conveyor.backends.broker import sqs as sqs_module
from conveyor.backends.broker.sqs import MAX_DELAY, SqsTransport
from conveyor.backends.broker.sqs_settings import parse_sqs_url
from conveyor.backends.broker.transport import Delivery, Lane, Outgoing
from conveyor.errors import InvalidName, StoreError, StoreUnavailable

LANE = Lane("jobs", 0)


def bodies(deliveries: list[Delivery]) -> list[bytes]:
    return sorted(d.body for d in deliveries)


def received_again(t: SqsTransport, lane: Lane = LANE, lease_s: float = 30) -> Delivery:
    """Wait until the lane hands out a message (one whose visibility ran out) and take it."""
    [d] = wait_until(lambda: t.receive(lane, 1, lease_s=lease_s), timeout=15,
                     message="the message to come back")
    return d


def test_publish_then_receive(transport: SqsTransport) -> None:
    transport.publish([Outgoing(LANE, b'{"n":1}'), Outgoing(LANE, b'{"n":2}')])
    got = transport.receive(LANE, 10, lease_s=30)
    assert bodies(got) == [b'{"n":1}', b'{"n":2}']
    assert all(d.deliveries == 1 and d.lane == LANE for d in got)
    assert transport.settle(got) == [True, True]
    assert transport.receive(LANE, 10, lease_s=30) == []


def test_receive_hands_out_at_most_limit_and_more_than_one_batch(transport: SqsTransport) -> None:
    transport.publish([Outgoing(LANE, str(i).encode()) for i in range(25)])
    first = transport.receive(LANE, 3, lease_s=30)
    assert len(first) == 3
    rest = transport.receive(LANE, 30, lease_s=30)  # SQS hands out 10 a call: it loops
    assert len(rest) == 22
    assert sorted(int(d.body) for d in first + rest) == list(range(25))
    assert transport.settle(first + rest) == [True] * 25


def test_a_held_message_is_nobody_elses(transport: SqsTransport, sqs_url: str) -> None:
    other = SqsTransport(parse_sqs_url(sqs_url))
    try:
        transport.publish([Outgoing(LANE, b"x")])
        [d] = transport.receive(LANE, 1, lease_s=30)
        assert other.receive(LANE, 1, lease_s=30) == []
        depth = transport.depth(LANE)
        assert (depth.ready, depth.in_flight) == (0, 1)
        assert transport.settle([d]) == [True]
    finally:
        other.close()


def test_taken_back_goes_to_another_receiver_and_the_first_holder_is_told(
        transport: SqsTransport, sqs_url: str) -> None:
    other = SqsTransport(parse_sqs_url(sqs_url))
    try:
        transport.publish([Outgoing(LANE, b"x")])
        [first] = transport.receive(LANE, 1, lease_s=1)
        second = received_again(other)
        assert (second.body, second.deliveries) == (b"x", 2)
        # The first holder's lease ran out: neither extend nor settle may act for it...
        assert transport.extend([first], lease_s=30) == [False]
        assert transport.settle([first]) == [False]
        # ...and the message is still the second holder's.
        assert transport.depth(LANE).in_flight == 1
        assert other.settle([second]) == [True]
        assert transport.depth(LANE).in_flight == 0
    finally:
        other.close()


def test_a_late_settle_does_not_delete_the_redelivered_message_in_one_process(
        transport: SqsTransport) -> None:
    """moto (and SQS, by its documentation) may accept an outdated receipt handle: the
    transport refuses it itself, from the lease it knows ran out."""
    transport.publish([Outgoing(LANE, b"x")])
    [first] = transport.receive(LANE, 1, lease_s=1)
    second = received_again(transport)
    assert transport.settle([first, second]) == [False, True]
    assert transport.depth(LANE).in_flight == 0


def test_a_call_sqs_answered_at_once_does_not_wait(transport: SqsTransport,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch call (send, change visibility, delete) pauses only before trying again."""
    paused: list[float] = []
    monkeypatch.setattr(sqs_module.time, "sleep", paused.append)
    transport.publish([Outgoing(LANE, b"x")])
    [d] = transport.receive(LANE, 1, lease_s=30)
    assert transport.extend([d], lease_s=30) == [True]
    assert transport.settle([d]) == [True]
    assert paused == []


def test_extend_keeps_the_message(transport: SqsTransport) -> None:
    transport.publish([Outgoing(LANE, b"x")])
    [d] = transport.receive(LANE, 1, lease_s=1)
    assert transport.extend([d], lease_s=30) == [True]
    # Past the first lease (on this machine's clock), nobody else gets the message.
    start = time.monotonic()
    wait_until(lambda: time.monotonic() - start > 2.5, timeout=5)
    assert transport.receive(LANE, 1, lease_s=30) == []
    assert transport.settle([d]) == [True]


def test_give_back_makes_the_message_receivable_at_once(transport: SqsTransport) -> None:
    transport.publish([Outgoing(LANE, b"x")])
    [d] = transport.receive(LANE, 1, lease_s=300)
    transport.give_back([d])
    [again] = transport.receive(LANE, 1, lease_s=30)
    assert again.deliveries == 2
    assert transport.settle([d]) == [False]  # given back: not this delivery's any more
    assert transport.settle([again]) == [True]


def test_delay_holds_the_message(transport: SqsTransport) -> None:
    transport.publish([Outgoing(LANE, b"later", delay=1.5)])
    assert transport.receive(LANE, 1, lease_s=30) == []
    assert transport.depth(LANE).delayed == 1
    d = received_again(transport)
    assert d.body == b"later"


def test_delay_past_max_delay_is_held_max_delay(transport: SqsTransport) -> None:
    assert transport.max_delay == MAX_DELAY == 900
    transport.publish([Outgoing(LANE, b"much later", delay=86_400)])
    assert transport.receive(LANE, 1, lease_s=30) == []
    assert transport.depth(LANE).delayed == 1


def test_wait(transport: SqsTransport) -> None:
    lanes = [Lane("jobs", 0), Lane("jobs", 1)]
    assert transport.wait(lanes, 0.2) is False
    transport.publish([Outgoing(Lane("jobs", 1), b"x")])
    assert transport.wait(lanes, 0) is True  # already there: at once
    transport.settle(transport.receive(Lane("jobs", 1), 1, lease_s=30))
    transport.publish([Outgoing(Lane("jobs", 1), b"y", delay=1)])
    assert transport.wait(lanes, 10) is True  # when the delay is over


def test_depth_and_purge_do_not_create_queues(transport: SqsTransport) -> None:
    assert transport.depth(Lane("never", 0)) == transport.depth(Lane("never", None))
    assert transport.depth(Lane("never", 0)).ready == 0
    assert transport.purge(Lane("never", None)) == 0
    assert transport.queues() == []


def test_purge(transport: SqsTransport) -> None:
    dead = Lane("jobs", None)
    transport.publish([Outgoing(dead, str(i).encode()) for i in range(3)])
    assert transport.purge(dead) == 3
    assert transport.depth(dead).ready == 0
    assert transport.receive(dead, 10, lease_s=30) == []


def test_queues_reads_conveyor_names_back(transport: SqsTransport, sqs_url: str) -> None:
    names = ["default", "a.b:c_d-e", "x-dead", "y-p0"]
    transport.publish([Outgoing(Lane(n, 0), b"x") for n in names])
    transport.publish([Outgoing(Lane("only-dead", None), b"x")])
    other = SqsTransport(parse_sqs_url(sqs_url.replace("prefix=t", "prefix=u")))
    try:
        other.publish([Outgoing(Lane("elsewhere", 0), b"x")])
        assert transport.queues() == sorted([*names, "only-dead"])
        assert other.queues() == ["elsewhere"]
    finally:
        other.close()


def test_job_lanes_redrive_into_the_dead_lane(sqs_url: str, sqs_client: Any) -> None:
    t = SqsTransport(parse_sqs_url(f"{sqs_url}&max_receives=2"))
    try:
        t.publish([Outgoing(LANE, b"poison")])
        url = sqs_client.get_queue_url(QueueName=f"{t.settings.prefix}-jobs-p0")["QueueUrl"]
        attrs = sqs_client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        policy = json.loads(attrs["RedrivePolicy"])
        assert int(policy["maxReceiveCount"]) == 2
        assert policy["deadLetterTargetArn"].endswith(f"{t.settings.prefix}-jobs-dead")
        # Received twice without a settle: SQS moves it to the dead lane by itself.
        for _ in range(2):
            [d] = t.receive(LANE, 1, lease_s=30)
            t.give_back([d])
        assert t.receive(LANE, 1, lease_s=30) == []
        [dead] = t.receive(Lane("jobs", None), 1, lease_s=30)
        assert dead.body == b"poison"
    finally:
        t.close()


def test_queues_deleted_behind_its_back_are_made_again(transport: SqsTransport, sqs_url: str,
                                                       sqs_client: Any) -> None:
    """Every queue of the prefix gone at once, as after a restart of an SQS-compatible server
    that keeps nothing on disk (moto's), or a cleanup script: each process finds its queue gone
    once and says so, then makes the queues again, the dead lane first (the job lanes' redrive
    policy names it)."""
    worker = SqsTransport(parse_sqs_url(sqs_url))
    try:
        transport.publish([Outgoing(LANE, b"before")])
        [d] = worker.receive(LANE, 1, lease_s=30)
        assert worker.settle([d]) == [True]
        prefix = transport.settings.prefix
        for url in sqs_client.list_queues(QueueNamePrefix=f"{prefix}-")["QueueUrls"]:
            sqs_client.delete_queue(QueueUrl=url)

        # A lane the producer never used: made at once, its dead lane again first.
        transport.publish([Outgoing(Lane("jobs", 1), b"new lane")])
        with pytest.raises(StoreError, match="does not exist"):
            worker.receive(LANE, 1, lease_s=30)
        assert worker.receive(LANE, 1, lease_s=30) == []  # made again
        transport.publish([Outgoing(LANE, b"after")])
        got = worker.receive(LANE, 1, lease_s=30) + worker.receive(Lane("jobs", 1), 1, lease_s=30)
        assert bodies(got) == [b"after", b"new lane"]
        assert worker.settle(got) == [True, True]
        url = sqs_client.get_queue_url(QueueName=f"{prefix}-jobs-p0")["QueueUrl"]
        attrs = sqs_client.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])
        target = json.loads(attrs["Attributes"]["RedrivePolicy"])["deadLetterTargetArn"]
        assert target.endswith(f":{prefix}-jobs-dead")
        sqs_client.get_queue_url(QueueName=f"{prefix}-jobs-dead")  # it exists again
    finally:
        worker.close()


def test_a_queue_name_sqs_cannot_hold_sends_nothing(transport: SqsTransport) -> None:
    with pytest.raises(InvalidName, match="too long for SQS"):
        transport.publish([Outgoing(LANE, b"x"), Outgoing(Lane("q" * 80, 0), b"y")])
    assert transport.receive(LANE, 10, lease_s=30) == []


def _dead_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens here once closed


def test_an_unreachable_endpoint_is_store_unavailable() -> None:
    t = SqsTransport(parse_sqs_url(f"sqs://127.0.0.1:{_dead_port()}/?prefix=gone&timeout=1"))
    try:
        with pytest.raises(StoreUnavailable, match="unreachable"):
            t.receive(LANE, 1, lease_s=30)
        with pytest.raises(StoreUnavailable, match="unreachable"):
            t.depth(LANE)
    finally:
        t.close()


def test_publish_that_fails_says_what_may_have_been_taken(transport: SqsTransport) -> None:
    transport.publish([Outgoing(LANE, b"x")])  # the queue exists
    # A transport that knows the queue's URL already, on an endpoint that went away.
    gone = SqsTransport(parse_sqs_url(f"sqs://127.0.0.1:{_dead_port()}/?prefix="
                                      f"{transport.settings.prefix}&timeout=1"))
    gone._urls[LANE] = transport._urls[LANE]
    try:
        with pytest.raises(StoreUnavailable, match="0 of 1 messages were taken before this "
                                                   "batch of 1, which may or may not have been"):
            gone.publish([Outgoing(LANE, b"y")])
    finally:
        gone.close()


def test_a_second_purge_within_a_minute_is_refused_clearly(transport: SqsTransport) -> None:
    dead = Lane("jobs", None)
    transport.publish([Outgoing(dead, b"x")])
    assert transport.purge(dead) == 1
    transport.publish([Outgoing(dead, b"y")])
    with pytest.raises(StoreError, match="at most once a minute"):
        transport.purge(dead)
