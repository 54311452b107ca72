"""One Conveyor worker process for the benchmark.

``python -m bench_conveyor_worker sqlite:////tmp/x.db [--concurrency 8] [--queues default]``
(with ``benchmarks/`` on ``PYTHONPATH``). Stop it with SIGTERM.
"""

from __future__ import annotations

import argparse
import logging

from bench_conveyor_app import make_app

from conveyor.worker import Worker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--prefetch", type=int, default=0, help="Worker(prefetch=...)")
    parser.add_argument("--queues", default="default")
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    app, _ = make_app(args.url)
    try:
        Worker(app, queues=args.queues, concurrency=args.concurrency, prefetch=args.prefetch).run()
    finally:
        app.close()


if __name__ == "__main__":
    main()
