"""The RQ side of ``redis_bench.py``: the no-op and probe functions, and one SimpleWorker.

``python -m bench_redis_rq redis://127.0.0.1:6379/11`` (with ``benchmarks/`` on
``PYTHONPATH``) runs ``rq.worker.SimpleWorker`` (jobs run in the worker process, no fork per
job) on queue ``default`` with logging at WARNING; stop it with SIGTERM.
``bench_redis_common`` explains the clock and probe variables.
"""

from __future__ import annotations

import argparse
import logging

from bench_redis_common import probe_started, tick_end, tick_start


def noop(i: int = 0) -> None:
    tick_start()
    tick_end()


def probe(token: str) -> None:
    probe_started(token)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url")
    args = parser.parse_args()
    from redis import Redis
    from rq import Queue
    from rq.worker import SimpleWorker

    conn = Redis.from_url(args.url)
    worker = SimpleWorker([Queue("default", connection=conn)], connection=conn)
    # No per-job log lines: RQ logs each job start and "Job OK" at INFO.
    worker.work(logging_level=logging.WARNING, with_scheduler=False)


if __name__ == "__main__":
    main()
