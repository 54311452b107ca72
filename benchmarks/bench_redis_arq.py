"""The arq side of ``redis_bench.py``: the no-op and probe coroutines, and one arq worker.

``python -m bench_redis_arq redis://127.0.0.1:6379/14 [--max-jobs 8] [--poll-delay 0.05]``
(with ``benchmarks/`` on ``PYTHONPATH``) runs ``arq.worker.Worker`` on arq's default queue
with logging at WARNING (arq logs every job start and end at INFO); stop it with SIGTERM.
arq's own default ``poll_delay`` is 0.5 s: an idle worker looks at the queue twice a second.
Tasks are ``async def``, the only kind arq runs natively. ``bench_redis_common`` explains the
clock and probe variables.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from typing import Any

from bench_redis_common import probe_started, tick_end, tick_start


async def noop(ctx: dict[str, Any], i: int = 0) -> None:
    tick_start()
    tick_end()


async def probe(ctx: dict[str, Any], token: str) -> None:
    probe_started(token)


def redis_settings(url: str) -> Any:
    from arq.connections import RedisSettings

    return RedisSettings.from_dsn(url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url")
    parser.add_argument("--max-jobs", type=int, default=8)
    parser.add_argument("--poll-delay", type=float, default=0.5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from arq.worker import Worker

    worker = Worker(
        functions=[noop, probe],  # type: ignore[list-item]
        redis_settings=redis_settings(args.url),
        max_jobs=args.max_jobs,
        poll_delay=args.poll_delay,
        log_results=False,
    )
    # arq 0.28 lets a CancelledError out of Worker.close() when SIGTERM lands while a finished
    # job's bookkeeping is still pending; the jobs themselves have run.
    with contextlib.suppress(asyncio.CancelledError):
        worker.run()


if __name__ == "__main__":
    main()
