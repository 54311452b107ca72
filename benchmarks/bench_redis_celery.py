"""The Celery side of ``redis_bench.py``: the no-op and probe tasks on a Redis broker.

The worker is Celery's own command, run by the driver as
``python -m celery -A bench_redis_celery worker -P threads -c 8 -l WARNING`` with
``$BENCH_REDIS_URL`` naming the broker database. No result backend and ``ignore_result``:
the tasks write nothing back. ``bench_redis_common`` explains the clock and probe variables.
"""

from __future__ import annotations

import os

from bench_redis_common import probe_started, tick_end, tick_start
from celery import Celery

NOOP = "bench.noop"
PROBE = "bench.probe"

app = Celery("bench", broker=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/10"))
app.conf.update(
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=True,
    # Celery's defaults otherwise: acks_late=False (acked when received), prefetch multiplier 4,
    # the kombu Redis transport's visibility timeout of 1 h for unacked messages.
)


@app.task(name=NOOP)
def noop(i: int = 0) -> None:
    tick_start()
    tick_end()


@app.task(name=PROBE)
def probe(token: str) -> None:
    probe_started(token)
