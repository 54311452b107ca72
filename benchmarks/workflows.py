"""What workflows cost: a batch and chains against the same jobs enqueued plainly, per store.

    .venv/bin/python benchmarks/workflows.py [--stores sqlite,postgres,redis] [--jobs 10000]
        [--rounds 3]

For each store and round, in a store of its own: ``enqueue_many`` of N plain jobs in one call,
the same N jobs as one batch with both callbacks (one atomic write), N plain jobs in calls of 10,
and N jobs as chains of 10 steps (one ``app.chain`` per chain, as many calls); each drained by an
in-process burst worker (conveyor.testing.drain) and timed. Printed: jobs/s for each, and the
ratios batch/plain and chains/plain-in-tens (below 1: the dependencies cost that share). Medians
over the rounds. Compare within one run only.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
import redis

from conveyor import Conveyor
from conveyor.testing import drain

PG = os.environ.get("CONVEYOR_BENCH_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/test")
REDIS = os.environ.get("CONVEYOR_BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
CHAIN = 10


def store_url(store: str, tmp: Path) -> tuple[str, Callable[[], None]]:
    """A fresh, empty store and how to remove it."""
    if store == "sqlite":
        db = tmp / f"{uuid.uuid4().hex}.db"
        return f"sqlite:///{db}", lambda: None
    if store == "postgres":
        schema = f"bench_wf_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")

        def drop() -> None:
            with psycopg.connect(PG, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA {schema} CASCADE")
        return f"{PG}?options=-csearch_path%3D{schema}", drop
    client = redis.Redis.from_url(REDIS)
    client.flushdb()
    return REDIS, client.flushdb


def make_app(url: str) -> Conveyor:
    app = Conveyor(url)

    @app.task(name="bench.work")
    def work(n: int) -> int:
        return n

    @app.task(name="bench.done")
    def done() -> None:
        return None

    return app


def one_round(store: str, jobs: int, tmp: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for shape in ("plain", "batch", "plain10", "chains"):
        url, remove = store_url(store, tmp)
        app = make_app(url)
        work, done = app.tasks["bench.work"], app.tasks["bench.done"]
        try:
            t0 = time.perf_counter()
            if shape == "plain":
                work.enqueue_many([{"n": i} for i in range(jobs)])
            elif shape == "plain10":  # as many calls as the chains make
                for c in range(jobs // CHAIN):
                    work.enqueue_many([{"n": c * CHAIN + k} for k in range(CHAIN)])
            elif shape == "batch":
                with app.batch(on_success=done.s(), on_complete=done.s()):
                    for i in range(jobs):
                        work.enqueue(i)
            else:
                for c in range(jobs // CHAIN):
                    app.chain(*[work.s(c * CHAIN + k) for k in range(CHAIN)])
            t1 = time.perf_counter()
            finished = drain(app)
            t2 = time.perf_counter()
            assert len(finished) >= jobs, (shape, len(finished))
            out[f"{shape}_enqueue"] = jobs / (t1 - t0)
            out[f"{shape}_drain"] = jobs / (t2 - t1)
        finally:
            app.close()
            remove()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default="sqlite,postgres,redis")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    logging.getLogger("conveyor").setLevel(logging.ERROR)  # the no-persistence warning, per app
    with tempfile.TemporaryDirectory() as tmp:
        for store in args.stores.split(","):
            rounds = [one_round(store, args.jobs, Path(tmp)) for _ in range(args.rounds)]
            med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
            print(f"{store} ({args.jobs} jobs, {args.rounds} rounds, medians, jobs/s)")
            for what in ("enqueue", "drain"):
                plain = med[f"plain_{what}"]
                tens = med[f"plain10_{what}"]
                print(f"  {what:8} plain {plain:9,.0f}  batch {med[f'batch_{what}']:9,.0f} "
                      f"(x{med[f'batch_{what}'] / plain:.2f})  plain in tens {tens:9,.0f}  "
                      f"chains of {CHAIN} {med[f'chains_{what}']:9,.0f} "
                      f"(x{med[f'chains_{what}'] / tens:.2f})")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
