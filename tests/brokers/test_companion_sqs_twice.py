"""SQS may hand one message to two receivers at once: its at-least-once delivery does, and
moto's server does whenever two receives race (its receive checks a message's visibility and
marks it received without a lock). Each receiver then holds a live receipt handle, and SQS
(moto: always) acts on the message through any handle it had. With a companion store the
second delivery's ``take`` must leave a live lease given for the same message alone; and once
a lease has lapsed, so that a delivery of the same message takes the record over, what the
old holder does with its delivery must not reach the message the new one runs."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from brokerkit import wait_for

from conveyor import JobState, LeaseLost
from conveyor.backends.base import Backend, NewJob

pytestmark = pytest.mark.parametrize("broker", ["sqs+sqlite", "sqs-fifo+sqlite"], indirect=True)

BASE: dict[str, Any] = {"task": "t", "queue": "q", "args": "{}", "max_attempts": 3,
                        "timeout": 30.0}


def _in_flight(sqs_client: Any, url: str) -> bool:
    """Whether the queue's one message is held by a receiver (none visible, one not)."""
    got = sqs_client.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages",
                                      "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    return (got["ApproximateNumberOfMessages"], got["ApproximateNumberOfMessagesNotVisible"]) \
        == ("0", "1")


def test_a_second_delivery_of_a_message_being_run_is_left_alone(
        open_broker: Callable[[], Backend], sqs_client: Any) -> None:
    """Two receivers get one message while its first holder runs it: the second's take leaves
    the record to the first (no lost attempt, no fencing), the second runs nothing, and the
    first finishes the job as if the second receive never happened. Before, the second take
    fenced the first: one job handed out twice at once (a conformance test of concurrent
    claims saw it on SQS)."""
    from conveyor.backends.base import Lease

    first, second = open_broker(), open_broker()
    first.enqueue_many([NewJob(**BASE)])
    (job,) = wait_for(lambda: first.claim("q", 1, worker_id="w1", lease_s=30))  # type: ignore[misc]
    receipt = first._held[job.lease_token].delivery.handle  # type: ignore[attr-defined]
    sqs_client.change_message_visibility(QueueUrl=receipt.url, ReceiptHandle=receipt.handle,
                                         VisibilityTimeout=0)
    # The second receiver gets the message (it is in flight again) and runs nothing.
    handed: list[Any] = []
    deadline = time.monotonic() + 15
    while not (handed or _in_flight(sqs_client, receipt.url)):
        assert time.monotonic() < deadline, "the second receiver never got the message"
        handed += second.claim("q", 1, worker_id="w2", lease_s=30)
    assert handed == [], "one message's job was handed out twice at once"
    kept = second.get(job.id)
    assert kept is not None and kept.state is JobState.RUNNING
    assert kept.lease_token == job.lease_token and kept.attempts == 1 and kept.errors == []
    lease = Lease(job.id, job.lease_token or "")
    assert first.heartbeat([lease], lease_s=30) == set()
    first.ack(lease, '"ok"')
    done = first.get(job.id)
    assert done is not None and done.state is JobState.SUCCEEDED and done.attempts == 1


@pytest.mark.parametrize("how", ["ack", "heartbeat"])
def test_the_fenced_holder_leaves_the_message_to_the_holder_of_the_record(
        open_broker: Callable[[], Backend], sqs_client: Any, how: str) -> None:
    """A holder whose lease lapsed (it stopped answering for a while) is fenced by the next
    delivery of its message; its outcome (or heartbeat) is then refused, and its delivery is
    left alone. Settled, it deleted the message the holder of the record runs: that holder's
    next heartbeat was refused, it stopped the job, and the record stayed ``running`` with
    nothing to deliver or reap it (a network-cut fault test left one such job behind)."""
    from conveyor.backends.base import Lease

    first, second = open_broker(), open_broker()
    first.enqueue_many([NewJob(**BASE)])
    (job,) = wait_for(lambda: first.claim("q", 1, worker_id="w1", lease_s=1))  # type: ignore[misc]
    # Both the message's visibility and the store's lease run out: the broker hands the
    # message out again, and the first holder still has its receipt handle.
    time.sleep(1.5)
    (again,) = wait_for(lambda: second.claim("q", 1, worker_id="w2", lease_s=30))  # type: ignore[misc]
    assert again.id == job.id and again.attempts == 2
    stale = Lease(job.id, job.lease_token or "")
    if how == "heartbeat":
        assert first.heartbeat([stale], lease_s=30) == {job.id}
    else:
        with pytest.raises(LeaseLost):
            first.ack(stale, None)
    lease = Lease(again.id, again.lease_token or "")
    assert second.heartbeat([lease], lease_s=30) == set(), \
        "the holder of the record lost its message to the fenced holder's settle"
    second.ack(lease, '"ok"')
    assert second.get(job.id).state is JobState.SUCCEEDED  # type: ignore[union-attr]
