"""The Conveyor side of the RabbitMQ benchmark: the no-op and probe tasks, and one worker process.

``python -m bench_rabbitmq_conveyor 'amqp://guest:guest@127.0.0.1:5672/%2F?prefix=NAME'
[--concurrency 8] [--prefetch 0]`` (with ``benchmarks/`` on ``PYTHONPATH``) runs
``conveyor.worker.Worker`` on queue ``default``; stop it with SIGTERM. The store is Conveyor's
RabbitMQ transport as it ships: quorum-queue lanes ``NAME.default.p-1``, ``.p0``, ``.p1`` (the
default priority levels) and ``NAME.default.dead``. ``bench_rabbitmq_common`` explains the
clock and probe variables.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from bench_rabbitmq_common import probe_started, tick_end, tick_start

from conveyor import Conveyor
from conveyor.worker import Worker

NOOP = "bench.noop"
PROBE = "bench.probe"
LEVELS = (-1, 0, 1)  # the transport's default priority levels: a lane each


def lane_queues(prefix: str, queue: str = "default") -> list[str]:
    """Every queue Conveyor declares for ``queue`` under ``prefix`` (no delays are sent)."""
    return [f"{prefix}.{queue}.p{lv}" for lv in LEVELS] + [f"{prefix}.{queue}.dead"]


def make_app(url: str) -> tuple[Conveyor, Any, Any]:
    """An app on ``url`` with ``bench.noop(i)`` (does nothing) and ``bench.probe(token)``."""
    app = Conveyor(url)

    @app.task(name=NOOP)
    def noop(i: int = 0) -> None:
        tick_start()
        tick_end()

    @app.task(name=PROBE)
    def probe(token: str) -> None:
        probe_started(token)

    return app, noop, probe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--prefetch", type=int, default=0, help="Worker(prefetch=...)")
    args = parser.parse_args()
    # WARNING: the worker logs nothing per job at this level (start/stop lines only at INFO).
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    app, _, _ = make_app(args.url)
    try:
        Worker(app, queues="default", concurrency=args.concurrency, prefetch=args.prefetch).run()
    finally:
        app.close()


if __name__ == "__main__":
    main()
