"""The worker's CPU time per job: one worker, default settings, draining no-op jobs.

``python benchmarks/worker_cpu.py redis|sqlite|postgres [-n 20000] [--runs 3]`` enqueues ``n``
no-op jobs on a fresh store (Redis: a new ``?prefix=`` on ``--redis``, deleted after;
SQLite: a temporary file; PostgreSQL: a new schema in ``--postgres``, dropped after), then
starts one worker process (``Worker(app, burst=True)``: every other setting its default, as
``conveyor worker --burst`` runs it), which drains them and stops. The worker process
reports its own CPU time (``time.process_time()``: every thread, user and system) and wall
time over ``Worker.run``; this prints each run and the median of the runs.

CPU time per job is the number to compare: on a shared machine another process's load
stretches wall time far more than it changes the CPU a job costs the worker.

``--profile cprofile:PATH`` writes a cProfile of every thread of the worker (one profiler per
thread, merged) to PATH (read it with ``python -m pstats PATH``); ``--profile
pyinstrument:PATH`` a pyinstrument text report of the event loop's thread, ``--profile
py-spy:PATH`` py-spy's samples of every thread that holds the GIL (collapsed stacks; py-spy installed beside this
Python). Each slows the worker down: the CPU figures of a profiled run are not comparable.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

NOOP = "bench.noop"
BATCH = 1000  # jobs per enqueue_many


def make_app(url: str) -> tuple[Any, Any]:
    from conveyor import Conveyor

    app = Conveyor(url)

    @app.task(name=NOOP)
    def noop(i: int = 0) -> None:
        return None

    return app, noop


# -- the worker process ----------------------------------------------------------------------
def _profiled_threads(path: str) -> Callable[[], None]:
    """Profile every thread with a cProfile of its own; the returned call merges them into
    ``path``."""
    import cProfile
    import pstats

    profilers: list[cProfile.Profile] = []
    lock = threading.Lock()

    def start(*_: Any) -> None:
        profiler = cProfile.Profile()
        with lock:
            profilers.append(profiler)
        profiler.enable()  # replaces this hook in this thread

    threading.setprofile(start)
    main = cProfile.Profile()
    profilers.append(main)
    main.enable()

    def finish() -> None:
        main.disable()
        threading.setprofile(None)  # type: ignore[arg-type]
        stats: pstats.Stats | None = None
        for p in profilers:
            p.create_stats()
            if not p.stats:  # type: ignore[attr-defined]
                continue
            if stats is None:
                stats = pstats.Stats(p)
            else:
                stats.add(p)
        if stats is not None:
            stats.dump_stats(path)

    return finish


def run_worker(url: str, concurrency: int, profile: str | None) -> dict[str, Any]:
    """Drain the store's jobs with one worker (burst) in this process; its CPU and wall time."""
    from conveyor.worker import Worker

    app, _ = make_app(url)
    app.backend  # opened (the client's imports, a migration) outside the timing  # noqa: B018
    worker = Worker(app, burst=True, concurrency=concurrency)
    finish: Callable[[], None] | None = None
    instrument: Any = None
    if profile:
        kind, _, path = profile.partition(":")
        if kind == "cprofile":
            finish = _profiled_threads(path)
        elif kind == "pyinstrument":
            from pyinstrument import Profiler

            instrument = Profiler(interval=0.0002, async_mode="disabled")
            instrument.start()
        else:
            raise SystemExit(f"unknown profiler {kind!r}")
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    try:
        worker.run()
    finally:
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        usage = resource.getrusage(resource.RUSAGE_SELF)
        if finish is not None:
            finish()
        if instrument is not None:
            instrument.stop()
            with open(profile.partition(":")[2], "w") as f:  # type: ignore[union-attr]
                f.write(instrument.output_text(unicode=False, color=False))
        app.close()
    return {"cpu_s": cpu, "wall_s": wall, "succeeded": worker.counters.succeeded,
            "user_s": usage.ru_utime - usage0.ru_utime, "sys_s": usage.ru_stime - usage0.ru_stime,
            # context switches: each hand-off between threads that sleeps costs one or two
            "switches": (usage.ru_nvcsw - usage0.ru_nvcsw) + (usage.ru_nivcsw - usage0.ru_nivcsw)}


# -- the stores ------------------------------------------------------------------------------
@contextmanager
def fresh_store(kind: str, args: argparse.Namespace) -> Iterator[str]:
    """A URL to an empty store of ``kind``, removed afterwards."""
    tag = f"cpu{uuid.uuid4().hex[:10]}"
    if kind == "redis":
        import redis

        base = args.redis
        yield f"{base}{'&' if '?' in base else '?'}prefix={tag}"
        r = redis.Redis.from_url(base)
        try:
            for pattern in (f"{tag}*", f"{{{tag}}}*"):
                keys = list(r.scan_iter(match=pattern, count=1000))
                for i in range(0, len(keys), 500):
                    r.delete(*keys[i:i + 500])
        finally:
            r.close()
    elif kind == "sqlite":
        with tempfile.TemporaryDirectory(prefix="conveyor-worker-cpu-") as d:
            yield f"sqlite:///{d}/jobs.db"
    elif kind == "postgres":
        import psycopg

        base = args.postgres
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(f'CREATE SCHEMA "{tag}"')
            try:
                sep = "&" if "?" in base else "?"
                yield f"{base}{sep}options=-csearch_path%3D{tag}"
            finally:
                admin.execute(f'DROP SCHEMA "{tag}" CASCADE')
    else:
        raise SystemExit(f"unknown store {kind!r}")


def one_run(kind: str, args: argparse.Namespace, profile: str | None) -> dict[str, Any]:
    with fresh_store(kind, args) as url:
        app, noop = make_app(url)
        try:
            for start in range(0, args.n, BATCH):
                noop.enqueue_many([(i,) for i in range(start, min(start + BATCH, args.n))])
        finally:
            app.close()
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", url,
               "--concurrency", str(args.concurrency)]
        if profile and profile.startswith("py-spy:"):
            # Sampled from outside, every thread holding the GIL: collapsed stacks (flamegraph.pl's input).
            spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
            cmd = [spy, "record", "--format", "raw", "--rate", "1000", "--threads", "--gil",
                   "--output", profile.partition(":")[2], "--", *cmd]
        elif profile:
            cmd += ["--profile", profile]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True)
        # (the last line: py-spy writes lines of its own)
        report = [line for line in out.stdout.splitlines() if line.startswith("{")][-1]
        result: dict[str, Any] = json.loads(report)
    if result["succeeded"] != args.n:
        raise SystemExit(f"the worker ran {result['succeeded']} of {args.n} jobs: {result}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("store", nargs="?", choices=("redis", "sqlite", "postgres"))
    parser.add_argument("-n", type=int, default=20_000, help="jobs per run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8, help="Worker's (default 8)")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--postgres", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument("--profile", help="cprofile:PATH, pyinstrument:PATH or py-spy:PATH (one run)")
    parser.add_argument("--worker", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(run_worker(args.worker, args.concurrency, args.profile)))
        return
    if args.store is None:
        parser.error("which store: redis, sqlite or postgres")
    cpus, rates = [], []
    for i in range(1 if args.profile else args.runs):
        r = one_run(args.store, args, args.profile)
        cpu_ms, rate = r["cpu_s"] / args.n * 1000, args.n / r["wall_s"]
        cpus.append(cpu_ms)
        rates.append(rate)
        print(f"{args.store} run {i + 1}: {args.n} jobs, worker CPU {cpu_ms:.4f} ms/job "
              f"(user {r['user_s'] / args.n * 1000:.4f}, system {r['sys_s'] / args.n * 1000:.4f}; "
              f"{r['switches'] / args.n:.2f} context switches a job), {rate:,.0f} jobs/s wall",
              flush=True)
    print(f"{args.store} median of {len(cpus)}: worker CPU {statistics.median(cpus):.4f} ms/job "
          f"(runs {', '.join(f'{c:.4f}' for c in cpus)}), "
          f"{statistics.median(rates):,.0f} jobs/s wall")


if __name__ == "__main__":
    main()
