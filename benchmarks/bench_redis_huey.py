"""The Huey side of ``redis_bench.py``: the no-op and probe tasks on ``RedisHuey``.

The consumer is Huey's own, run by the driver as
``python -m huey.bin.huey_consumer bench_redis_huey.huey -w 8 -k thread -q`` with
``$BENCH_REDIS_URL`` naming the database (``-q``: no per-task log lines). RedisHuey's defaults
otherwise (``blocking=True``: an idle consumer waits in ``BRPOP``).
``bench_redis_common`` explains the clock and probe variables.
"""

from __future__ import annotations

import os

from bench_redis_common import probe_started, tick_end, tick_start
from huey import RedisHuey

NOOP = "bench.noop"
PROBE = "bench.probe"

huey = RedisHuey("bench", url=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13"))


@huey.task(name=NOOP)
def noop(i: int = 0) -> None:
    tick_start()
    tick_end()


@huey.task(name=PROBE)
def probe(token: str) -> None:
    probe_started(token)
