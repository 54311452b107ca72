"""The SAQ side of the Redis benchmark: the no-op and probe coroutines, and one SAQ worker.

``python -m bench_redis_saq redis://127.0.0.1:6379/9 [--concurrency 8]`` (with ``benchmarks/``
on ``PYTHONPATH``) runs ``saq.Worker`` on queue ``default`` with logging at WARNING; stop it
with SIGTERM. SAQ's defaults otherwise: an idle worker waits in ``BLMOVE`` (no polling), a
finished job is kept (``ttl`` 600 s). Tasks are ``async def``. ``bench_redis_common`` explains
the clock and probe variables.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import Any

from bench_redis_common import probe_started, tick_end, tick_start


async def noop(ctx: dict[str, Any], *, i: int = 0) -> None:
    tick_start()
    tick_end()


async def probe(ctx: dict[str, Any], *, token: str) -> None:
    probe_started(token)


def make_queue(url: str) -> Any:
    from saq import Queue

    return Queue.from_url(url, name="default")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url")
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    from saq import Worker

    async def run() -> None:
        queue = make_queue(args.url)
        await queue.connect()
        worker = Worker(queue, functions=[noop, probe], concurrency=args.concurrency)
        try:
            await worker.start()  # returns after SIGTERM/SIGINT, once the running jobs finished
        finally:
            await queue.disconnect()

    asyncio.run(run())


if __name__ == "__main__":
    main()
