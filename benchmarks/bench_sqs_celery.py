"""The Celery side of the SQS benchmark: the no-op and probe tasks on kombu's SQS transport.

The worker is Celery's own command, run by the driver as ``python -m celery -A bench_sqs_celery
worker -P threads -c 8 -l WARNING -Q <prefix>_celery --without-gossip --without-mingle
--without-heartbeat``. kombu's SQS transport sends the producer's and the acks' requests with
boto3 and the worker's receives with its own asynchronous client on pycurl. Configured to keep
what Conveyor keeps on this store, as far as Celery can:

* an at-least-once lease: ``acks_late`` (the message is deleted after the task returns, so a
  worker that dies mid-task leaves it to come back) and prefetch multiplier 1 (at most ``-c`` =
  8 messages received and not yet deleted per worker, as Conveyor holds at most its 8 slots);
* the lease is the queue's visibility timeout, ``visibility_timeout`` = 30 s, Conveyor's default
  lease. kombu never extends it: a task still running after 30 s is handed out again.

Receives are kombu's defaults: long polling (``WaitTimeSeconds`` 10) and a 1 s pause after a
poll that took nothing (``polling_interval``; ``$BENCH_CELERY_POLLING_INTERVAL`` sets another,
for the ``celery-poll50ms`` system). Remote control is off (on SQS it needs SNS for its fanout
exchange); no result backend (``ignore_result``). The endpoint and the queue come from
``$BENCH_SQS_ENDPOINT`` and ``$BENCH_CELERY_QUEUE``, the credentials from the environment (dummy
ones: the server is a local moto); ``bench_rabbitmq_common`` explains the clock and probe
variables.
"""

from __future__ import annotations

import os

from bench_rabbitmq_common import probe_started, tick_end, tick_start
from celery import Celery
from kombu import Queue

NOOP = "bench.noop"
PROBE = "bench.probe"
LEASE_S = 30  # Conveyor's default lease (Conveyor(visibility_timeout=30.0))
# Each Celery system of the driver has a queue of its own; the worker is told which.
QUEUE = os.environ.get("BENCH_CELERY_QUEUE", f"{os.environ.get('BENCH_SQS_PREFIX', 'bsqs')}_celery")
ENDPOINT = os.environ.get("BENCH_SQS_ENDPOINT", "127.0.0.1:4566")

app = Celery("bench", broker=f"sqs://{ENDPOINT}")
app.conf.update(
    task_queues=[Queue(QUEUE)],
    task_default_queue=QUEUE,
    task_default_routing_key=QUEUE,
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    broker_transport_options={
        "region": "us-east-1",
        "is_secure": False,
        "visibility_timeout": LEASE_S,
        "polling_interval": float(os.environ.get("BENCH_CELERY_POLLING_INTERVAL", "1")),
    },
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
