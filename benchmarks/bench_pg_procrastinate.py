"""The procrastinate side of ``postgres_bench.py``: the same no-op task, and its worker process.

``python -m bench_pg_procrastinate postgresql://... [--concurrency 8]`` (with ``benchmarks/`` on
``PYTHONPATH``) runs procrastinate's worker on queue ``default``; stop it with SIGTERM.
procrastinate is needed only for the benchmark: ``.venv/bin/pip install procrastinate``.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from procrastinate import App, PsycopgConnector

NOOP = "bench.noop"


def make_app(conninfo: str) -> tuple[App, Any]:
    """A procrastinate app on ``conninfo`` with one task, ``bench.noop(i)``, that does nothing."""
    app = App(connector=PsycopgConnector(conninfo=conninfo))

    @app.task(name=NOOP, queue="default")
    def noop(i: int = 0) -> None:
        return None

    return app, noop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("conninfo")
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    # Built through the module's import name, not __main__ (procrastinate warns about that).
    import bench_pg_procrastinate

    app, _ = bench_pg_procrastinate.make_app(args.conninfo)
    # Defaults otherwise: LISTEN/NOTIFY on, 5 s polling fallback, finished jobs kept.
    app.run_worker(queues=["default"], concurrency=args.concurrency, wait=True)


if __name__ == "__main__":
    main()
