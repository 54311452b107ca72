"""What a message broker must do for :class:`~conveyor.backends.broker.core.BrokerBackend`.

The core keeps the job's lifecycle (attempts, errors, retries, dead-lettering, fencing) in the
message body and in its own lease table; a transport only moves bodies between lanes. A lane
is one physical broker queue: each Conveyor queue has one lane per priority level (the broker
then serves lower levels first, as the stores do) and one dead lane (the dead-letter queue).

Rules every transport keeps:

* ``publish`` returns only once the broker has the messages durably (RabbitMQ publisher
  confirms, an SQS send's reply). If it raises, some of them may have been taken.
* ``receive`` hands out at most ``limit`` messages, each held by this transport until it is
  settled or given back, or until the broker takes it back by itself (the holder's connection
  died, its visibility timeout ran out): the broker's own lease. Taken back, a message goes to
  another receiver with ``deliveries`` one higher.
* ``settle`` (ack, delete) and ``extend`` (heartbeat) report per delivery whether this holder
  still held it: False means the broker took it back and it may already be someone else's,
  so the caller must not record an outcome for it.
* A message published with ``delay`` is not received before ``min(delay, max_delay)`` seconds
  have passed; it may be received early past ``max_delay`` (the core publishes it again with
  the remaining delay).
* ``supports`` names what the broker adds to the core (capabilities of core.MISSING): "unique",
  a message whose ``dedup_id`` the broker took recently is dropped (SQS FIFO: within 5
  minutes); "fair", messages of one ``group`` are handed out in order, one hand-out at a time,
  and groups side by side. A transport without them ignores both fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Lane:
    """One broker queue: ``level`` is the priority level of a job lane, None the dead lane."""

    queue: str
    level: int | None

    @property
    def dead(self) -> bool:
        return self.level is None


@dataclass(frozen=True)
class Outgoing:
    lane: Lane
    body: bytes
    delay: float = 0.0  # seconds before it may be received
    # For brokers that deduplicate or group (SQS FIFO); others ignore them.
    dedup_id: str | None = None
    group: str | None = None


@dataclass
class Delivery:
    lane: Lane
    body: bytes
    handle: Any  # the transport's own (a channel and delivery tag, a receipt handle)
    deliveries: int  # times the broker has handed this message out, this time included
    # The broker's id of the message, the same in each of its deliveries (SQS's MessageId), or
    # None: one message handed out twice at once is told from two copies by it.
    message_id: str | None = None


@dataclass(frozen=True)
class LaneDepth:
    ready: int  # receivable now
    in_flight: int | None = None  # received and not settled; None if the broker cannot say
    delayed: int | None = None  # published with a delay that has not passed; None: unknown


class Transport(Protocol):
    kind: str  # the broker's name, for messages: "RabbitMQ", "SQS"
    max_delay: float  # the longest delay one publish can hold (seconds)
    supports: frozenset[str]  # of "unique", "fair" (see above)

    def publish(self, items: Sequence[Outgoing]) -> None: ...

    def receive(self, lane: Lane, limit: int, *, lease_s: float) -> list[Delivery]: ...

    def settle(self, deliveries: Sequence[Delivery]) -> list[bool]: ...

    def extend(self, deliveries: Sequence[Delivery], *, lease_s: float) -> list[bool]: ...

    def give_back(self, deliveries: Sequence[Delivery], *, counted: bool = False) -> None:
        """Make held messages receivable again at once (the core peeks at the dead lane this
        way). The broker may count it as a delivery. ``counted``: return once the lanes'
        counts (``depth``) hold them again, as far as the broker's counts can say (a listing
        followed by stats must not read them as gone)."""
        ...

    def wait(self, lanes: Sequence[Lane], timeout: float) -> bool:
        """Block up to ``timeout`` seconds until one of ``lanes`` may hold a receivable
        message; True if one does (at once if one already does)."""
        ...

    def depth(self, lane: Lane) -> LaneDepth: ...

    def purge(self, lane: Lane) -> int:
        """Delete every message of the lane that nobody holds; how many (or -1: unknown)."""
        ...

    def queues(self) -> list[str] | None:
        """The Conveyor queues that have lanes on the broker, or None if the broker cannot list
        its queues (the core then reports the queues this process has used)."""
        ...

    def close(self) -> None: ...
