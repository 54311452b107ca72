"""SQS may hand one message to two receivers at once: its at-least-once delivery does, and
moto's server does whenever two receives race (its receive checks a message's visibility and
marks it received without a lock). Each receiver then holds a live receipt handle, and SQS
(moto: always) acts on the message through any handle it had. With a companion store the
second ``take`` fences the first holder; what that holder does with its delivery afterwards
must not reach the message the second one runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from brokerkit import wait_for

from conveyor import JobState, LeaseLost
from conveyor.backends.base import Backend, NewJob

pytestmark = pytest.mark.parametrize("broker", ["sqs+sqlite", "sqs-fifo+sqlite"], indirect=True)

BASE: dict[str, Any] = {"task": "t", "queue": "q", "args": "{}", "max_attempts": 3,
                        "timeout": 30.0}


@pytest.mark.parametrize("how", ["ack", "heartbeat"])
def test_the_fenced_holder_leaves_the_message_to_the_holder_of_the_record(
        open_broker: Callable[[], Backend], sqs_client: Any, how: str) -> None:
    """The fenced holder's outcome (or heartbeat) is refused, and its delivery is left alone.
    Settled, it deleted the message the holder of the record runs: that holder's next
    heartbeat was refused, it stopped the job, and the record stayed ``running`` with nothing
    to deliver or reap it (a network-cut fault test left one such job behind)."""
    from conveyor.backends.base import Lease

    first, second = open_broker(), open_broker()
    first.enqueue_many([NewJob(**BASE)])
    (job,) = wait_for(lambda: first.claim("q", 1, worker_id="w1", lease_s=30))  # type: ignore[misc]
    # The broker hands the message out again while the first receipt is live, as when two
    # receives race: forced from outside the transport, through the first handle.
    receipt = first._held[job.lease_token].delivery.handle  # type: ignore[attr-defined]
    sqs_client.change_message_visibility(QueueUrl=receipt.url, ReceiptHandle=receipt.handle,
                                         VisibilityTimeout=0)
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
