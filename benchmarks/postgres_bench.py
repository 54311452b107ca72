"""Conveyor on PostgreSQL against procrastinate, on the same server, in one run.

    .venv/bin/python benchmarks/postgres_bench.py [--url postgresql://root@127.0.0.1:5432/test]
        [--jobs 20000] [--concurrency 8] [--rounds 1] [--latency-samples 300] [--seed N]
        [--systems conveyor,procrastinate]

Each round creates one fresh database per system on the server of ``--url`` (dropped at the
end) and runs, for each system in turn:

1. ``enqueue``       N no-op jobs, one call (one transaction) each: Conveyor ``task.enqueue``,
                     procrastinate ``task.defer``.
2. ``enqueue_many``  N no-op jobs, 1000 per call: Conveyor ``task.enqueue_many``, procrastinate
                     ``task.batch_defer``. The jobs table is emptied first; this is the backlog of (3).
3. ``drain``         the backlog, after ``ANALYZE``, run by ONE worker subprocess with 8 slots:
                     Conveyor ``Worker(concurrency=8)`` (``python -m bench_conveyor_worker``),
                     procrastinate's worker with ``concurrency=8`` (``python -m
                     bench_pg_procrastinate``). Throughput is N / (last finish - first start),
                     both from the database's clock.
4. ``latency``       the same worker, idle: one job at a time (5-20 ms random gap, each waited for
                     before the next); enqueue-to-start from the database's clock (Conveyor
                     ``attempted_at - created_at``; procrastinate ``started`` - ``deferred`` event).

Results go to stdout (a table and Conveyor/procrastinate ratios) and to
``benchmarks/results/postgres-latest.json``. procrastinate is needed only for this benchmark:
``.venv/bin/pip install procrastinate``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

HERE = Path(__file__).resolve().parent
RESULTS_DIR = HERE / "results"
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from bench_conveyor_app import make_app as make_conveyor_app  # noqa: E402
from sqlite_bench import (  # noqa: E402
    GAP_S,
    HEADER,
    Proc,
    Result,
    drain_timeout,
    fmt,
    latency_result,
    report,
    row,
    running,
    summarize,
    throughput,
    wait_until,
)

DEFAULT_URL = os.environ.get("CONVEYOR_BENCH_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/test")
BATCH = 1000
DONE_POLL_S = 0.002  # latency: how often the producer looks for the job's completion
SYSTEMS = ("conveyor", "procrastinate")


def with_dbname(url: str, dbname: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{dbname}"))


@contextlib.contextmanager
def fresh_database(admin_url: str, label: str) -> Iterator[str]:
    """A new database on ``admin_url``'s server, dropped (with its connections) afterwards."""
    name = f"conveyor_bench_{label}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_dbname(admin_url, name)
    finally:
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# -- the two systems behind one interface --------------------------------------------------------
class System:
    """What the scenarios need from a job system; the SQL reads its own tables directly."""

    name: str
    unfinished_sql: str  # -> one boolean: is any job still to run or running?
    window_sql: str  # -> succeeded count, first start, last finish (epoch s), jobs started twice
    finished_sql: str  # (id) -> one row once the job has finished
    latency_sql: str  # (ids) -> start - enqueue, seconds, per job
    reset_sql: str  # empty the jobs table

    def __init__(self, url: str, concurrency: int) -> None:
        self.url = url
        self.concurrency = concurrency
        self.db = psycopg.connect(url, autocommit=True)

    def enqueue(self, i: int) -> int:
        raise NotImplementedError

    def enqueue_batch(self, items: list[int]) -> None:
        raise NotImplementedError

    def worker_argv(self) -> list[str]:
        raise NotImplementedError

    def close(self) -> None:
        self.db.close()

    def one(self, sql: str, params: Any = None) -> Any:
        r = self.db.execute(sql.encode(), params).fetchone()
        return r[0] if r is not None else None


class ConveyorSystem(System):
    name = "conveyor"
    unfinished_sql = (
        "SELECT EXISTS (SELECT 1 FROM conveyor_jobs"
        " WHERE state IN ('scheduled', 'available', 'running'))"
    )
    window_sql = (
        "SELECT count(*), extract(epoch FROM min(attempted_at))::float8,"
        " extract(epoch FROM max(finished_at))::float8, count(*) FILTER (WHERE attempt > 1)"
        " FROM conveyor_jobs WHERE state = 'succeeded'"
    )
    finished_sql = "SELECT 1 FROM conveyor_jobs WHERE id = %s AND finished_at IS NOT NULL"
    latency_sql = (
        "SELECT extract(epoch FROM attempted_at - created_at)::float8 FROM conveyor_jobs"
        " WHERE id = ANY(%s)"
    )
    # Every conveyor_ table but the migrations' record, in one TRUNCATE: tables that reference
    # conveyor_jobs (conveyor_steps) must go with it, and the fair-sharing clocks, rate claims
    # and counters of the previous scenario with the jobs they describe.
    reset_sql = (
        "DO $$ BEGIN EXECUTE (SELECT 'TRUNCATE ' || string_agg(quote_ident(tablename), ', ')"
        " || ' RESTART IDENTITY CASCADE' FROM pg_tables WHERE schemaname = current_schema()"
        " AND tablename LIKE 'conveyor\\_%' AND tablename <> 'conveyor_schema_migrations'); END $$"
    )

    def __init__(self, url: str, concurrency: int) -> None:
        self.app, self.noop = make_conveyor_app(url)
        self.app.backend  # open and migrate outside the timing  # noqa: B018
        super().__init__(url, concurrency)

    def enqueue(self, i: int) -> int:
        return int(self.noop.enqueue(i).id)

    def enqueue_batch(self, items: list[int]) -> None:
        self.noop.enqueue_many([(i,) for i in items])

    def worker_argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "bench_conveyor_worker",
            self.url,
            "--concurrency",
            str(self.concurrency),
        ]

    def close(self) -> None:
        self.app.close()
        super().close()


class ProcrastinateSystem(System):
    name = "procrastinate"
    unfinished_sql = (
        "SELECT EXISTS (SELECT 1 FROM procrastinate_jobs WHERE status IN ('todo', 'doing'))"
    )
    window_sql = (
        "SELECT (SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'),"
        " extract(epoch FROM min(at) FILTER (WHERE type = 'started'))::float8,"
        " extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded'))::float8,"
        " count(*) FILTER (WHERE type = 'started') - count(DISTINCT job_id) FILTER (WHERE type = 'started')"
        " FROM procrastinate_events"
    )
    finished_sql = "SELECT 1 FROM procrastinate_jobs WHERE id = %s AND status = 'succeeded'"
    latency_sql = (
        "SELECT extract(epoch FROM s.at - d.at)::float8 FROM procrastinate_events d"
        " JOIN procrastinate_events s ON s.job_id = d.job_id AND s.type = 'started'"
        " WHERE d.type = 'deferred' AND d.job_id = ANY(%s)"
    )
    reset_sql = (
        "TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_periodic_defers"
        " RESTART IDENTITY CASCADE"
    )

    def __init__(self, url: str, concurrency: int) -> None:
        from bench_pg_procrastinate import make_app

        self.app, self.noop = make_app(url)
        self.app.open()  # a sync connection pool, for defer from this (sync) producer
        self.app.schema_manager.apply_schema()
        super().__init__(url, concurrency)

    def enqueue(self, i: int) -> int:
        return int(self.noop.defer(i=i))

    def enqueue_batch(self, items: list[int]) -> None:
        self.noop.batch_defer(*[{"i": i} for i in items])

    def worker_argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "bench_pg_procrastinate",
            self.url,
            "--concurrency",
            str(self.concurrency),
        ]

    def close(self) -> None:
        self.app.close()
        super().close()


NOTES = {
    "conveyor": {
        "enqueue": "task.enqueue, one transaction each",
        "enqueue_many": f"task.enqueue_many, batches of {BATCH}",
        "drain": "1 worker process, Worker(concurrency={c})",
        "latency": "attempted_at - created_at (database clock); LISTEN/NOTIFY",
    },
    "procrastinate": {
        "enqueue": "task.defer, one transaction each",
        "enqueue_many": f"task.batch_defer, batches of {BATCH}",
        "drain": "1 worker process, run_worker(concurrency={c})",
        "latency": "'started' - 'deferred' event (database clock); LISTEN/NOTIFY",
    },
}


def scenarios(
    sys_: System, tmp: Path, args: argparse.Namespace, rng: random.Random
) -> list[Result]:
    n, name, notes = args.jobs, sys_.name, NOTES[sys_.name]
    results: list[Result] = []

    # 1. one by one
    t0 = time.perf_counter()
    for i in range(n):
        sys_.enqueue(i)
    dt = time.perf_counter() - t0
    assert sys_.one(f"SELECT count(*) FROM {name}_jobs") == n
    results.append(throughput(name, "enqueue", n, dt, note=notes["enqueue"]))
    report(results[-1])

    # 2. in batches, into an emptied table: the backlog of (3)
    sys_.db.execute(sys_.reset_sql.encode())
    t0 = time.perf_counter()
    for start in range(0, n, BATCH):
        sys_.enqueue_batch(list(range(start, min(n, start + BATCH))))
    dt = time.perf_counter() - t0
    assert sys_.one(f"SELECT count(*) FROM {name}_jobs") == n
    results.append(throughput(name, "enqueue_many", n, dt, note=notes["enqueue_many"]))
    report(results[-1])

    # 3. drain with one worker process, with planner statistics on the backlog as autovacuum
    # would have them soon after a bulk insert (without them procrastinate's fetch degrades)
    sys_.db.execute(b"ANALYZE")
    worker = Proc(f"{name}-worker", sys_.worker_argv(), tmp)
    with running(worker):
        wait_until(
            f"{n} {name} jobs to finish",
            lambda: not sys_.one(sys_.unfinished_sql),
            drain_timeout(n),
            (worker,),
        )
        wall = time.perf_counter() - worker.started
        done, first, last, reruns = sys_.db.execute(sys_.window_sql.encode()).fetchone()
        assert done == n, (name, done, n)
        note = notes["drain"].format(c=args.concurrency) + f"; {wall:.1f}s incl. process start"
        if reruns:
            note += f"; {reruns} jobs ran more than once"
        results.append(throughput(name, "drain", n, last - first, note=note))
        results[-1].extra.update(window_start=first, window_end=last)
        report(results[-1])

        # 4. idle enqueue-to-start latency, same worker, now idle
        time.sleep(0.5)
        ids: list[int] = []
        t0 = time.perf_counter()
        for i in range(args.latency_samples + 1):  # the first is a warm-up, dropped
            time.sleep(rng.uniform(*GAP_S))
            job_id = sys_.enqueue(i)
            wait_until(
                f"{name} job {job_id} to finish",
                lambda jid=job_id: sys_.one(sys_.finished_sql, [jid]) is not None,
                30,
                (worker,),
                interval=DONE_POLL_S,
            )
            if i:
                ids.append(job_id)
        dt = time.perf_counter() - t0
        samples = [r[0] for r in sys_.db.execute(sys_.latency_sql.encode(), [ids]).fetchall()]
        assert len(samples) == len(ids), (name, len(samples), len(ids))
        results.append(latency_result(name, samples, dt, note=notes["latency"]))
        report(results[-1])
    return results


# -- reporting ------------------------------------------------------------------------------------
def ratios(summary: list[Result]) -> list[dict[str, Any]]:
    """Conveyor / procrastinate per scenario: >1 is faster for jobs/s, <1 is faster for latency."""
    by = {(r.system, r.scenario): r for r in summary}
    out: list[dict[str, Any]] = []
    for scenario in ("enqueue", "enqueue_many", "drain", "latency"):
        a, b = by.get(("conveyor", scenario)), by.get(("procrastinate", scenario))
        if a is None or b is None:
            continue
        entry: dict[str, Any] = {
            "conveyor": "conveyor",
            "peer": "procrastinate",
            "scenario": scenario,
        }
        if scenario == "latency":
            entry["p50_ratio"] = a.p50_ms / b.p50_ms if a.p50_ms is not None and b.p50_ms else None
            entry["p99_ratio"] = a.p99_ms / b.p99_ms if a.p99_ms is not None and b.p99_ms else None
        elif a.jobs_per_s is not None and b.jobs_per_s:
            entry["jobs_per_s_ratio"] = a.jobs_per_s / b.jobs_per_s
        else:
            continue
        out.append(entry)
    return out


def print_ratios(rs: list[dict[str, Any]]) -> None:
    if not rs:
        return
    print(
        "\nRatios, Conveyor / procrastinate (jobs/s: >1 means Conveyor is faster; "
        "latency: <1 means Conveyor is faster)"
    )
    for e in rs:
        if "jobs_per_s_ratio" in e:
            value = f"jobs/s x{e['jobs_per_s_ratio']:.2f}"
        else:
            value = f"p50 x{fmt(e['p50_ratio'], '.2f')}, p99 x{fmt(e['p99_ratio'], '.2f')}"
        print(f"  {e['scenario']:<13} {value}")


def environment(admin_url: str) -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }
    with contextlib.suppress(Exception), psycopg.connect(admin_url, connect_timeout=5) as conn:
        env["postgresql"] = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        for setting in ("synchronous_commit", "fsync", "shared_buffers"):
            env[setting] = conn.execute(f"SHOW {setting}").fetchone()[0]  # type: ignore[index]
    from importlib.metadata import PackageNotFoundError, version

    for pkg in ("conveyor", "procrastinate", "psycopg", "psycopg-pool"):
        with contextlib.suppress(PackageNotFoundError):
            env[pkg] = version(pkg)
    return env


# -- main ---------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Benchmark Conveyor on PostgreSQL against procrastinate on the same server."
    )
    parser.add_argument(
        "--url",
        default=DEFAULT_URL,
        help="a database to connect to for CREATE/DROP DATABASE "
        "($CONVEYOR_BENCH_POSTGRES_URL; default %(default)s)",
    )
    parser.add_argument(
        "--jobs", type=int, default=20000, help="jobs per throughput scenario (default 20000)"
    )
    parser.add_argument("--concurrency", type=int, default=8, help="worker slots (default 8)")
    parser.add_argument(
        "--rounds", type=int, default=1, help="repeat every scenario; report medians"
    )
    parser.add_argument(
        "--latency-samples", type=int, default=300, help="jobs timed one at a time (default 300)"
    )
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help="comma-separated subset of: " + ", ".join(SYSTEMS),
    )
    parser.add_argument("--seed", type=int, default=None, help="seed of the random gaps")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "postgres-latest.json")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.concurrency < 1 or args.rounds < 1 or args.latency_samples < 1:
        parser.error("--jobs, --concurrency, --rounds and --latency-samples must be >= 1")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if not systems or set(systems) - set(SYSTEMS):
        parser.error(f"--systems: choose from {', '.join(SYSTEMS)}")
    if "procrastinate" in systems:
        try:
            import procrastinate  # noqa: F401
        except ImportError:
            parser.error(
                "procrastinate is not installed: .venv/bin/pip install procrastinate "
                "(or --systems conveyor)"
            )

    rng = random.Random(args.seed)
    started = time.perf_counter()
    print(
        f"Conveyor PostgreSQL benchmark: {args.jobs} jobs, concurrency {args.concurrency}, "
        f"{args.rounds} round(s), {args.latency_samples} latency samples; "
        f"systems: {', '.join(systems)}",
        flush=True,
    )
    classes = {"conveyor": ConveyorSystem, "procrastinate": ProcrastinateSystem}
    all_rounds: list[list[Result]] = []
    for k in range(args.rounds):
        print(f"\nround {k + 1}/{args.rounds}", flush=True)
        print("  " + HEADER)
        results: list[Result] = []
        with tempfile.TemporaryDirectory(prefix="conveyor-pgbench-") as d:
            for name in systems:
                with fresh_database(args.url, name) as url:
                    system = classes[name](url, args.concurrency)
                    try:
                        results += scenarios(system, Path(d), args, rng)
                    finally:
                        system.close()
        all_rounds.append(results)

    summary = summarize(all_rounds)
    peer_ratios = ratios(summary)
    elapsed = time.perf_counter() - started
    print(
        f"\nSummary ({args.jobs} jobs, concurrency {args.concurrency}, {args.rounds} round(s), "
        f"{elapsed:.0f}s total)"
    )
    print(HEADER)
    for r in summary:
        print(row(r))
    print_ratios(peer_ratios)

    args.output.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": "postgres_bench",
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "params": {
            "jobs": args.jobs,
            "concurrency": args.concurrency,
            "rounds": args.rounds,
            "latency_samples": args.latency_samples,
            "systems": systems,
            "batch": BATCH,
            "seed": args.seed,
        },
        "environment": environment(args.url),
        "elapsed_s": elapsed,
        "results": [r.public() for r in summary],
        "ratios": peer_ratios,
        "rounds": [[r.public() for r in rs] for rs in all_rounds],
    }
    tmp_out = args.output.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(doc, indent=2) + "\n")
    tmp_out.replace(args.output)
    print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
