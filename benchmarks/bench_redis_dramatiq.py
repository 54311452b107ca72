"""The Dramatiq side of ``redis_bench.py``: the no-op and probe actors on a ``RedisBroker``.

The worker is Dramatiq's own command, run by the driver as
``python -m dramatiq bench_redis_dramatiq -p 1 -t 8 -Q default`` with ``$BENCH_REDIS_URL``
naming the database (Dramatiq logs nothing per message at its default level).
``bench_redis_common`` explains the clock and probe variables.
"""

from __future__ import annotations

import os

import dramatiq
from bench_redis_common import probe_started, tick_end, tick_start
from dramatiq.brokers.redis import RedisBroker

broker = RedisBroker(url=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/12"))
dramatiq.set_broker(broker)


@dramatiq.actor(actor_name="bench_noop", queue_name="default")
def noop(i: int = 0) -> None:
    tick_start()
    tick_end()


@dramatiq.actor(actor_name="bench_probe", queue_name="default")
def probe(token: str) -> None:
    probe_started(token)
