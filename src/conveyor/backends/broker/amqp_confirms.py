"""A RabbitMQ channel whose publishes wait for their publisher confirms together.

pika's blocking channel in confirm mode waits for each message's confirm before it sends the
next: one round trip per message, so a batch enqueue costs as many. This publisher turns
confirm mode on through the blocking channel's underlying channel (``_impl``) with its own
callbacks, sends a whole batch, then serves the connection (the blocking channel's
``_flush_output``, which stops when a condition holds or the channel closes) until every
message of the batch is confirmed. The call still fails if any message is nacked or returned
(``mandatory``: it reached no queue), as the one-by-one publish did: the caller learns that
some of the batch may not have been taken.

Those two names are pika's own, not its public API (the blocking adapter uses them the same
way for its confirms, since pika 1.0). ``usable`` says whether a channel has them: the
transport publishes one by one on a pika without them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pika
import pika.exceptions as pex


def usable(channel: Any) -> bool:
    return hasattr(channel, "_impl") and hasattr(channel, "_flush_output")


class ConfirmingPublisher:
    """Confirm mode on ``channel`` (a pika BlockingChannel used for nothing else)."""

    def __init__(self, channel: Any) -> None:
        self._ch = channel
        self._impl = channel._impl
        self._seq = 0  # the delivery tag of the last message sent (confirms count from 1)
        self._waiting: set[int] = set()
        self._nacked = 0
        self._returned: list[str] = []
        ready: list[object] = []
        self._impl.confirm_delivery(ack_nack_callback=self._on_confirm, callback=ready.append)
        self._impl.add_on_return_callback(self._on_return)
        self._ch._flush_output(lambda: bool(ready))

    @property
    def is_open(self) -> bool:
        return bool(self._ch.is_open)

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        tag = int(method.delivery_tag)
        done = {t for t in self._waiting if t <= tag} if method.multiple else {tag}
        self._waiting -= done
        if isinstance(method, pika.spec.Basic.Nack):
            self._nacked += len(done)

    def _on_return(self, channel: Any, method: Any, props: Any, body: bytes) -> None:
        # Sent before the message's ack, so it is in before the batch is done.
        self._returned.append(f"{method.reply_code} {method.reply_text}")

    def publish(self, messages: Sequence[tuple[str, str, bytes, Any]]) -> None:
        """Send each ``(exchange, routing_key, body, properties)``, ``mandatory``; return once
        all are confirmed. Raises NackError or UnroutableError (the batch was sent whole, so
        the others may have been taken) or what a closed channel or connection raises."""
        self._nacked, self._returned = 0, []
        for exchange, key, body, props in messages:
            self._impl.basic_publish(exchange, key, body, props, mandatory=True)
            self._seq += 1
            self._waiting.add(self._seq)
        self._ch._flush_output(lambda: not self._waiting)
        if self._waiting:  # the channel closed before its confirms came
            raise pex.ChannelWrongStateError(
                f"channel closed with {len(self._waiting)} publish(es) unconfirmed")
        if self._nacked:
            raise pex.NackError([None] * self._nacked)
        if self._returned:
            raise pex.UnroutableError(self._returned)
