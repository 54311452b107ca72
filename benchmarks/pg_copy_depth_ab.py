"""PostgreSQL bulk enqueue of jobs with a depth limit (max_depth), by the per-job insert that
took them before and by the batch path (COPY from COPY_MIN_JOBS on), against a raw COPY.

    .venv/bin/python benchmarks/pg_copy_depth_ab.py [--jobs 20000] [--rounds 3] [--url ...]

Backend level (``Backend.enqueue_many`` of prebuilt NewJobs, 1000 per call): each round keeps
the three writers on three fresh databases and alternates them batch by batch, the order
rotating, as ``pg_copy_ab.py --interleave`` does. The old path is had by letting only
``_plain`` jobs (no depth limit) into the batch path, which is what it was.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import pg_copy_ab as ab  # noqa: E402
import postgres_bench as pb  # noqa: E402

from conveyor.backends.base import NewJob  # noqa: E402
from conveyor.backends.postgres import PostgresBackend  # noqa: E402
from conveyor.backends.postgres import enqueue as pg_enqueue  # noqa: E402

BATCHABLE = pg_enqueue._batchable


def batch(start: int, stop: int) -> list[NewJob]:
    return [NewJob(task="noop", queue="default", args=json.dumps({"i": i}), max_attempts=3,
                   timeout=30.0, max_depth=10**9) for i in range(start, stop)]


def one_round(url: str, n: int, rnd: int) -> dict[str, float]:
    names = ["per-job insert", "batch path", "raw COPY"]
    spent = dict.fromkeys(names, 0.0)
    with contextlib.ExitStack() as stack:
        dbs = [stack.enter_context(pb.fresh_database(url, f"depthab{k}")) for k in range(3)]
        backends = {}
        for name, db in zip(names[:2], dbs, strict=False):
            pb.ConveyorSystem(db, 8).close()  # migrated outside the timing
            backends[name] = stack.enter_context(contextlib.closing(PostgresBackend(db)))
        raw = stack.enter_context(ab.raw_copier(dbs[2]))
        for k, start in enumerate(range(0, n, pb.BATCH)):
            stop = min(n, start + pb.BATCH)
            jobs = batch(start, stop)
            shift = (k + rnd) % len(names)
            for name in names[shift:] + names[:shift]:
                t0 = time.perf_counter()
                if name == "raw COPY":
                    raw(start, stop)
                else:
                    old = name == "per-job insert"
                    pg_enqueue._batchable = pg_enqueue._plain if old else BATCHABLE  # type: ignore[assignment]
                    backends[name].enqueue_many(jobs)
                spent[name] += time.perf_counter() - t0
    pg_enqueue._batchable = BATCHABLE  # type: ignore[assignment]
    return {name: n / dt for name, dt in spent.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default=pb.DEFAULT_URL)
    p.add_argument("--jobs", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    rates: dict[str, list[float]] = {}
    for rnd in range(a.rounds):
        for name, rate in one_round(a.url, a.jobs, rnd).items():
            rates.setdefault(name, []).append(rate)
        print(f"round {rnd + 1}: " + ", ".join(f"{k} {v[-1]:,.0f}/s" for k, v in rates.items()),
              flush=True)
    for name in ("per-job insert", "batch path"):
        ratios = [x / r for x, r in zip(rates[name], rates["raw COPY"], strict=True)]
        print(f"{name:>14}: median {statistics.median(rates[name]):,.0f}/s, / raw COPY median "
              f"x{statistics.median(ratios):.2f}, rounds " + ", ".join(f"x{x:.2f}" for x in ratios))


if __name__ == "__main__":
    main()
