"""The Dramatiq side of the RabbitMQ benchmark: the no-op and probe actors on a RabbitmqBroker.

The worker is Dramatiq's own command, run by the driver as ``python -m dramatiq
bench_rabbitmq_dramatiq -p 1 -t 8 -Q <prefix>.dramatiq`` with ``dramatiq_queue_prefetch=8``.
Configured to keep what Conveyor keeps on this store, as far as Dramatiq can:

* persistent messages (Dramatiq's ``delivery_mode=2``) and publisher confirms
  (``confirm_delivery=True``; Dramatiq's default is off);
* manual acks after the actor returns (Dramatiq's only mode), 8 unacked messages per worker
  (Dramatiq's default prefetch is twice its threads);
* quorum queues: ``RabbitmqBroker`` declares classic queues, so this subclass adds
  ``x-queue-type: quorum`` to the arguments of the queue and of its delay queue (``.DQ``; the
  dead-letter queue ``.XQ`` stays classic, with its fixed message TTL).

``bench_rabbitmq_common`` explains the clock and probe variables.
"""

from __future__ import annotations

from typing import Any

import dramatiq
from bench_rabbitmq_common import amqp_url, prefix, probe_started, tick_end, tick_start
from dramatiq.brokers.rabbitmq import RabbitmqBroker

QUEUE = f"{prefix()}.dramatiq"


class QuorumRabbitmqBroker(RabbitmqBroker):
    def _build_queue_arguments(self, queue_name: str) -> dict[str, Any]:
        arguments: dict[str, Any] = super()._build_queue_arguments(queue_name)
        arguments["x-queue-type"] = "quorum"
        return arguments


broker = QuorumRabbitmqBroker(url=amqp_url(), confirm_delivery=True)
dramatiq.set_broker(broker)


@dramatiq.actor(actor_name="bench_noop", queue_name=QUEUE)
def noop(i: int = 0) -> None:
    tick_start()
    tick_end()


@dramatiq.actor(actor_name="bench_probe", queue_name=QUEUE)
def probe(token: str) -> None:
    probe_started(token)
