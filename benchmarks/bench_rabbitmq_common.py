"""What every worker process of the RabbitMQ benchmark shares: the drain clock and the probe.

The drain clock is ``bench_redis_common``'s (it needs no Redis: ``BENCH_EXPECT`` and
``BENCH_DONE``, or ``BENCH_SPLIT_PREFIX`` for several processes). The probe reports differ:
nothing of Redis is needed on this store, so a probe body takes ``time.time()`` first thing and
sends ``"<token> <time>"`` as one UDP datagram to ``$BENCH_PROBE_ADDR`` (``host:port`` on
loopback), where the driver's listener thread reads it. The send comes after the timestamp, so
it is not part of the latency measured.

Environment, set by the driver (``harness/rabbitmq_store.py``):

``BENCH_AMQP_URL``        the broker (``amqp://guest:guest@127.0.0.1:5672/%2F``)
``BENCH_RABBITMQ_PREFIX`` the prefix of every queue and exchange this system declares, unique
                          to the run, so the benchmark can delete them afterwards
``BENCH_PROBE_ADDR``      where probe reports go
"""

from __future__ import annotations

import os
import socket
import threading
import time

from bench_redis_common import tick_end, tick_start

__all__ = ["amqp_url", "prefix", "probe_started", "tick_end", "tick_start"]

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


def amqp_url() -> str:
    return os.environ.get("BENCH_AMQP_URL", DEFAULT_URL)


def prefix() -> str:
    return os.environ.get("BENCH_RABBITMQ_PREFIX", "bench-rmq")


_sock: socket.socket | None = None
_addr: tuple[str, int] | None = None
_lock = threading.Lock()


def probe_started(token: str) -> None:
    """Report that probe ``token`` started now (call it first thing in the probe body)."""
    now = time.time()
    global _sock, _addr
    if _sock is None:
        with _lock:
            if _sock is None:
                host, port = os.environ["BENCH_PROBE_ADDR"].rsplit(":", 1)
                _addr = (host, int(port))
                _sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    assert _addr is not None
    _sock.sendto(f"{token} {now!r}".encode(), _addr)
