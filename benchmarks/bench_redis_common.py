"""What every worker process of ``redis_bench.py`` shares: the drain clock and the latency probe.

The peers store no start or finish times that the driver could read back, so each system's
no-op task calls :func:`tick` and its probe task calls :func:`probe_started`, in the worker
process, with these environment variables set by the driver:

``BENCH_REDIS_URL``   the system's own Redis database (``redis://127.0.0.1:6379/N``)
``BENCH_EXPECT``      drain: the number of no-op jobs to count (0 or unset: no clock)
``BENCH_SPLIT_PREFIX`` drain with several worker processes (instead of ``BENCH_EXPECT``):
                      see ``bench_split_clock``
``BENCH_DONE``        drain: a file; once ``BENCH_EXPECT`` no-op bodies have returned, the
                      wall-clock time of the first body start and of the last body end, and
                      the process's CPU time (``time.process_time()``, all threads) at both,
                      are written to it as JSON

A probe body takes ``time.time()`` first thing and pushes ``"<token> <time>"`` onto the
``bench:probe`` list of the system's database; the driver waits for it with ``BLPOP``, so it
does not poll. The push comes after the timestamp, so it is not part of the latency measured.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

PROBE_KEY = "bench:probe"


class DrainClock:
    """First body start and last body end of ``expect`` no-op jobs, in the worker process."""

    def __init__(self, expect: int, path: str) -> None:
        self.expect = expect
        self.path = path
        self.lock = threading.Lock()
        self.first_start: float | None = None
        self.cpu_first: float | None = None
        self.last_end: float | None = None
        self.count = 0
        self.written = False

    def start(self) -> None:
        if self.first_start is None:
            now, cpu = time.time(), time.process_time()
            with self.lock:
                if self.first_start is None:
                    self.first_start, self.cpu_first = now, cpu

    def end(self) -> None:
        now = time.time()
        with self.lock:
            self.count += 1
            if self.last_end is None or now > self.last_end:
                self.last_end = now
            if self.count < self.expect or self.written:
                return
            self.written = True
            doc = {
                "first_start": self.first_start,
                "last_end": self.last_end,
                "cpu_first": self.cpu_first,
                "cpu_last": time.process_time(),
                "count": self.count,
            }
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, self.path)


_clock: Any = None
_expect = int(os.environ.get("BENCH_EXPECT", "0") or 0)
_done = os.environ.get("BENCH_DONE")
if _expect > 0 and _done:
    _clock = DrainClock(_expect, _done)
elif os.environ.get("BENCH_SPLIT_PREFIX"):  # several worker processes share the backlog
    from bench_split_clock import from_env

    _clock = from_env()


def tick_start() -> None:
    if _clock is not None:
        _clock.start()


def tick_end() -> None:
    if _clock is not None:
        _clock.end()


_probe_client: Any = None
_probe_lock = threading.Lock()


def probe_started(token: str) -> None:
    """Report that probe ``token`` started now (call it first thing in the probe body)."""
    now = time.time()
    global _probe_client
    if _probe_client is None:
        import redis

        with _probe_lock:
            if _probe_client is None:
                _probe_client = redis.Redis.from_url(
                    os.environ["BENCH_REDIS_URL"], socket_timeout=5, socket_connect_timeout=2
                )
    _probe_client.rpush(PROBE_KEY, f"{token} {now!r}")
