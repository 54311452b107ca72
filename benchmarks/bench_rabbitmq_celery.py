"""The Celery side of the RabbitMQ benchmark: the no-op and probe tasks on py-amqp (kombu).

The worker is Celery's own command, run by the driver as ``python -m celery -A
bench_rabbitmq_celery worker -P threads -c 8 -l WARNING -Q <prefix>.celery --without-gossip
--without-mingle --without-heartbeat``. Configured to keep what Conveyor keeps on this store,
as far as Celery can:

* a quorum queue (``x-queue-type: quorum``, durable) and persistent messages (Celery's default
  delivery mode);
* publisher confirms: ``confirm_publish`` makes every ``delay()`` wait for the broker's confirm;
* an at-least-once lease: ``acks_late`` (acked after the task returns, so a worker that dies
  mid-task gives the message back) and prefetch multiplier 1 (at most ``-c`` = 8 unacked
  messages per worker, as Conveyor holds at most its 8 slots).

Two things are off because the benchmark does not use them and they would leave objects in a
shared broker: remote control (a ``celery.pidbox`` exchange and a queue per worker) and the
native delayed delivery that Celery starts whenever it sees a quorum queue (28 queues and 29
exchanges named ``celery_delayed_*``, global to the vhost, for ETA tasks). No result backend
(``ignore_result``). ``bench_rabbitmq_common`` explains the clock and probe variables.
"""

from __future__ import annotations

from bench_rabbitmq_common import amqp_url, prefix, probe_started, tick_end, tick_start
from celery import Celery
from celery.worker.consumer.delayed_delivery import DelayedDelivery
from kombu import Exchange, Queue

NOOP = "bench.noop"
PROBE = "bench.probe"
QUEUE = f"{prefix()}.celery"

# Celery would declare its ETA machinery (global names, see above) at every worker start.
DelayedDelivery.include_if = lambda self, c: False

app = Celery("bench", broker=amqp_url())
app.conf.update(
    task_queues=[
        Queue(
            QUEUE,
            Exchange(QUEUE, type="direct"),
            routing_key=QUEUE,
            queue_arguments={"x-queue-type": "quorum"},
        )
    ],
    task_default_queue=QUEUE,
    task_default_exchange=QUEUE,
    task_default_routing_key=QUEUE,
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    broker_transport_options={"confirm_publish": True},
    worker_enable_remote_control=False,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=True,
)


@app.task(name=NOOP)
def noop(i: int = 0) -> None:
    tick_start()
    tick_end()


@app.task(name=PROBE)
def probe(token: str) -> None:
    probe_started(token)
