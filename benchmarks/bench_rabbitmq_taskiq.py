"""The Taskiq side of the RabbitMQ benchmark: the no-op and probe tasks on taskiq-aio-pika.

The worker is Taskiq's own command, run by the driver as ``python -m taskiq worker
bench_rabbitmq_taskiq:broker --workers 1 --max-async-tasks 8 --log-level WARNING`` (one worker
process under Taskiq's supervising process). taskiq-aio-pika as it ships already keeps what
Conveyor keeps on this store: a quorum queue, persistent messages, publisher confirms (aio-pika's
channel waits for each one), and manual acks once the task is done (Taskiq's default ack type,
``when_saved``: after the result would be stored; there is no result backend here). ``qos=8``:
at most 8 unacked messages per worker, as Conveyor holds at most its 8 slots (aio-pika's default
in this broker is 10). Tasks are ``async def``, as Taskiq runs them best.
``bench_rabbitmq_common`` explains the clock and probe variables.
"""

from __future__ import annotations

from bench_rabbitmq_common import amqp_url, prefix, probe_started, tick_end, tick_start
from taskiq_aio_pika import AioPikaBroker
from taskiq_aio_pika.exchange import Exchange
from taskiq_aio_pika.queue import Queue

QUEUE = f"{prefix()}.taskiq"
DEAD = f"{QUEUE}.dead"

broker = AioPikaBroker(
    amqp_url(),
    qos=8,
    exchange=Exchange(name=QUEUE),
    task_queues=[Queue(name=QUEUE)],
    dead_letter_queue=Queue(name=DEAD),
)


@broker.task(task_name="bench_noop")
async def noop(i: int = 0) -> None:
    tick_start()
    tick_end()


@broker.task(task_name="bench_probe")
async def probe(token: str) -> None:
    probe_started(token)
