"""Conveyor on SQLite: enqueue rate, drain rate of one worker process, idle pick-up latency.

    .venv/bin/python benchmarks/sqlite_bench.py [--jobs 20000] [--concurrency 8] [--rounds 1]
                                                [--latency-samples 300] [--peers]

Scenarios (each round uses fresh database files in a temporary directory):

1. ``enqueue``       N no-op jobs, one ``task.enqueue`` call (one transaction) each.
2. ``enqueue_many``  N no-op jobs with ``task.enqueue_many``, 1000 per call.
3. ``drain``         the N-job backlog of (2) run by ONE worker subprocess
                     (``python -m bench_conveyor_worker``, ``--concurrency`` slots). Throughput
                     is N / (last ``finished_at`` - first ``attempted_at``), both from the
                     store, so the 50 ms completion polling adds no error.
4. ``latency``       the same worker, idle; one job at a time (5-20 ms random gap, each waited
                     for before the next): ``attempted_at - created_at`` from the store.
                     SQLite's clock ticks in whole milliseconds, so these are quantised to 1 ms.

``--peers`` runs the same scenarios on Huey's ``SqliteHuey`` (``pip install huey``) in the
same run and prints Conveyor/Huey ratios. Results go to stdout and to
``benchmarks/results/sqlite-latest.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS_DIR = HERE / "results"
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from bench_conveyor_app import make_app  # noqa: E402

BATCH = 1000
STATS_POLL_S = 0.05
GAP_S = (0.005, 0.020)


# -- results ----------------------------------------------------------------------------------
@dataclass
class Result:
    system: str  # "conveyor", "huey", ...
    scenario: str  # "enqueue", "enqueue_many", "drain", "latency"
    jobs: int
    seconds: float | None = None
    jobs_per_s: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    note: str = ""
    samples_ms: list[float] = field(default_factory=list, repr=False)
    # e.g. a drain's window (window_start, window_end: epoch s) for the harness's CPU figures
    extra: dict[str, Any] = field(default_factory=dict)

    def public(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("samples_ms")
        return d


def throughput(system: str, scenario: str, jobs: int, seconds: float, note: str = "") -> Result:
    return Result(
        system, scenario, jobs, seconds, jobs / seconds if seconds > 0 else None, note=note
    )


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[k]


def latency_result(system: str, samples_s: list[float], seconds: float, note: str = "") -> Result:
    ms = [s * 1000 for s in samples_s]
    return Result(
        system,
        "latency",
        len(ms),
        seconds,
        None,
        percentile(ms, 50),
        percentile(ms, 99),
        note=note,
        samples_ms=ms,
    )


# -- subprocesses ----------------------------------------------------------------------------
class Proc:
    """A benchmark subprocess with ``benchmarks/`` on its path and its output in a log file."""

    def __init__(
        self, name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None
    ):
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = os.pathsep.join(
            [str(HERE), *filter(None, [full_env.get("PYTHONPATH")])]
        )
        full_env.update(env or {})
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.started = time.perf_counter()
        self.popen = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, env=full_env
        )

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            raise RuntimeError(
                f"{self.name} exited early with {self.popen.returncode}:\n{self.log_tail()}"
            )

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                print(
                    f"  ! {self.name} ignored {signal.Signals(sig).name} for {timeout:g}s; killing it",
                    file=sys.stderr,
                )
                self.popen.kill()
                self.popen.wait()
        self._log.close()
        return self.popen.returncode

    def log_tail(self, lines: int = 30) -> str:
        if not self._log.closed:  # stop() closes it; the tail is still on disk
            self._log.flush()
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-lines:])
        except OSError:
            return "(no log)"


@contextlib.contextmanager
def running(proc: Proc, sig: int = signal.SIGTERM) -> Iterator[Proc]:
    try:
        yield proc
    finally:
        rc = proc.stop(sig)
        if rc not in (0, -sig):
            print(
                f"  ! {proc.name} exited with {rc}; last lines of {proc.log_path}:\n{proc.log_tail()}",
                file=sys.stderr,
            )


def wait_until(
    what: str,
    done: Callable[[], bool],
    timeout: float,
    procs: tuple[Proc, ...] = (),
    interval: float = STATS_POLL_S,
) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        for p in procs:
            p.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def drain_timeout(n: int) -> float:
    return max(60.0, n / 100)


# -- Conveyor -------------------------------------------------------------------------------
def sqlite_url(path: Path, query: str = "") -> str:
    return f"sqlite:///{path}" + (f"?{query}" if query else "")


def conveyor_scenarios(
    system: str, tmp: Path, args: argparse.Namespace, rng: random.Random, url_query: str = ""
) -> list[Result]:
    n = args.jobs
    results: list[Result] = []

    # 1. enqueue one by one
    app, noop = make_app(sqlite_url(tmp / f"{system}-enqueue.db", url_query))
    app.backend  # open and migrate outside the timing  # noqa: B018
    t0 = time.perf_counter()
    for i in range(n):
        noop.enqueue(i)
    dt = time.perf_counter() - t0
    assert count_jobs(tmp / f"{system}-enqueue.db") == n
    app.close()
    results.append(throughput(system, "enqueue", n, dt))
    report(results[-1])

    # 2. enqueue_many, 1000 per call; this database is the backlog of (3)
    db = tmp / f"{system}-drain.db"
    url = sqlite_url(db, url_query)
    app, noop = make_app(url)
    app.backend  # noqa: B018
    t0 = time.perf_counter()
    for start in range(0, n, BATCH):
        noop.enqueue_many([(i,) for i in range(start, min(n, start + BATCH))])
    dt = time.perf_counter() - t0
    assert count_jobs(db) == n
    results.append(throughput(system, "enqueue_many", n, dt, note=f"batches of {BATCH}"))
    report(results[-1])

    # 3. drain with one worker process
    worker = Proc(
        f"{system}-worker",
        [
            sys.executable,
            "-m",
            "bench_conveyor_worker",
            url,
            "--concurrency",
            str(args.concurrency),
        ],
        tmp,
    )
    with running(worker):

        def all_succeeded() -> bool:
            qs = {q.queue: q for q in app.backend.stats().queues}
            return "default" in qs and qs["default"].succeeded >= n

        wait_until(f"{n} jobs to succeed", all_succeeded, drain_timeout(n), (worker,))
        wall = time.perf_counter() - worker.started
        with contextlib.closing(sqlite3.connect(db)) as conn:
            done, first, last, reruns = conn.execute(
                "SELECT count(*), min(attempted_at), max(finished_at), sum(attempt > 1)"
                " FROM conveyor_jobs WHERE state = 'succeeded'"
            ).fetchone()
        assert done == n, (done, n)
        note = f"1 worker process, concurrency {args.concurrency}; {wall:.1f}s incl. process start"
        if reruns:
            note += f"; {reruns} jobs ran more than once"
        results.append(throughput(system, "drain", n, last - first, note=note))
        results[-1].extra.update(window_start=first, window_end=last)
        report(results[-1])

        # 4. idle enqueue-to-start latency, same worker, now idle
        def idle() -> bool:
            qs = {q.queue: q for q in app.backend.stats().queues}
            return qs["default"].running == 0 and qs["default"].available == 0

        wait_until("the worker to go idle", idle, 30, (worker,))
        time.sleep(0.2)
        ids: list[int] = []
        t0 = time.perf_counter()
        with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as conn:
            for i in range(args.latency_samples + 1):  # the first is a warm-up, dropped
                time.sleep(rng.uniform(*GAP_S))
                job = noop.enqueue(i)

                def finished(jid: int = job.id) -> bool:
                    sql = "SELECT finished_at FROM conveyor_jobs WHERE id = ?"
                    return conn.execute(sql, (jid,)).fetchone()[0] is not None

                wait_until(f"job {job.id} to finish", finished, 30, (worker,), interval=0.001)
                if i:
                    ids.append(job.id)
            dt = time.perf_counter() - t0
            rows = conn.execute(
                f"SELECT attempted_at - created_at FROM conveyor_jobs WHERE id IN ({','.join('?' * len(ids))})",
                ids,
            ).fetchall()
        results.append(
            latency_result(
                system,
                [r[0] for r in rows],
                dt,
                note="store clock (1 ms resolution); worker in another process",
            )
        )
        report(results[-1])
    app.close()
    return results


def count_jobs(db: Path) -> int:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return int(conn.execute("SELECT count(*) FROM conveyor_jobs").fetchone()[0])


# -- Huey -----------------------------------------------------------------------------------
HUEY_TUNED = ["-d", "0.002", "-m", "0.002"]


def huey_consumer(
    name: str,
    tmp: Path,
    db: Path,
    concurrency: int,
    extra: list[str],
    env: dict[str, str] | None = None,
) -> Proc:
    argv = [
        sys.executable,
        "-m",
        "huey.bin.huey_consumer",
        "bench_huey_app.huey",
        "-w",
        str(concurrency),
        "-k",
        "thread",
        *extra,
    ]
    return Proc(name, argv, tmp, env={"BENCH_HUEY_DB": str(db), **(env or {})})


def huey_scenarios(tmp: Path, args: argparse.Namespace, rng: random.Random) -> list[Result]:
    from bench_huey_app import make_huey

    n = args.jobs
    results: list[Result] = []
    db = tmp / "huey.db"
    huey, noop, probe = make_huey(str(db))

    # 1. enqueue one by one; this queue is also the backlog of (3): Huey has no batch enqueue.
    t0 = time.perf_counter()
    for i in range(n):
        noop(i)
    dt = time.perf_counter() - t0
    assert huey.pending_count() == n, huey.pending_count()
    results.append(
        throughput("huey", "enqueue", n, dt, note="SqliteHuey defaults (synchronous=FULL)")
    )
    report(results[-1])
    results.append(Result("huey", "enqueue_many", n, note="n/a: Huey has no batch enqueue"))
    report(results[-1])

    # 3. drain with one consumer process
    done_path = tmp / "huey-drain.json"
    consumer = huey_consumer(
        "huey-drain",
        tmp,
        db,
        args.concurrency,
        [],
        env={"BENCH_HUEY_EXPECT": str(n), "BENCH_HUEY_DONE": str(done_path)},
    )
    with running(consumer):
        wait_until(f"{n} Huey jobs to complete", done_path.exists, drain_timeout(n), (consumer,))
        wall = time.perf_counter() - consumer.started
    times = json.loads(done_path.read_text())
    assert times["completed"] == n, times
    results.append(
        throughput(
            "huey",
            "drain",
            n,
            times["last_complete"] - times["first_start"],
            note=f"1 consumer, -w {args.concurrency} -k thread; {wall:.1f}s incl. process start",
        )
    )
    results[-1].extra.update(window_start=times["first_start"], window_end=times["last_complete"])
    report(results[-1])

    # 4. latency, with Huey's default polling and with polling tuned to Conveyor's 2 ms step
    for label, extra in (("huey", []), ("huey-2ms", HUEY_TUNED)):
        consumer = huey_consumer(f"{label}-latency", tmp, db, args.concurrency, extra)
        with running(consumer):
            samples: list[float] = []
            t0 = time.perf_counter()
            for i in range(args.latency_samples + 1):
                time.sleep(rng.uniform(*GAP_S))
                sent = time.time()
                res = probe()
                box: list[float] = []

                def started(res: Any = res, box: list[float] = box) -> bool:
                    v = res.get(preserve=True)  # a read; without preserve, every poll is a write
                    if v is not None:
                        box.append(v)
                    return bool(box)

                wait_until("a Huey probe to run", started, 60, (consumer,), interval=0.001)
                if i:
                    samples.append(box[0] - sent)
            dt = time.perf_counter() - t0
        note = (
            "Huey default polling (-d 0.1, backoff 1.15, max 10s)"
            if not extra
            else "polling tuned: " + " ".join(extra)
        )
        results.append(
            latency_result(
                label, samples, dt, note=note + "; wall clock, enqueue call to task start"
            )
        )
        report(results[-1])
    huey.storage.close()
    return results


# -- reporting ------------------------------------------------------------------------------
def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


HEADER = f"{'system':<18} {'scenario':<13} {'jobs':>7} {'seconds':>8} {'jobs/s':>9} {'p50 ms':>7} {'p99 ms':>7}  note"


def row(r: Result) -> str:
    return (
        f"{r.system:<18} {r.scenario:<13} {r.jobs:>7} {fmt(r.seconds, '.2f'):>8} "
        f"{fmt(r.jobs_per_s, ',.0f'):>9} {fmt(r.p50_ms, '.1f'):>7} {fmt(r.p99_ms, '.1f'):>7}  {r.note}"
    )


def report(r: Result) -> None:
    print("  " + row(r), flush=True)


def summarize(rounds: list[list[Result]]) -> list[Result]:
    """One result per (system, scenario): the median over rounds; latency samples pooled."""
    keys: list[tuple[str, str]] = []
    groups: dict[tuple[str, str], list[Result]] = {}
    for rs in rounds:
        for r in rs:
            k = (r.system, r.scenario)
            if k not in groups:
                keys.append(k)
            groups.setdefault(k, []).append(r)
    out = []
    for k in keys:
        g = groups[k]
        first = g[0]
        if first.scenario == "latency":
            pooled = [s / 1000 for r in g for s in r.samples_ms]
            out.append(
                latency_result(first.system, pooled, sum(r.seconds or 0 for r in g), first.note)
            )
        elif first.seconds is None:
            out.append(first)
        else:
            secs = statistics.median(r.seconds for r in g if r.seconds is not None)
            nearest = min(g, key=lambda r: abs((r.seconds or 0) - secs))  # its note fits best
            out.append(throughput(first.system, first.scenario, first.jobs, secs, nearest.note))
        if len(rounds) > 1 and first.jobs_per_s is not None:
            out[-1].note += f" (median of {len(g)})"
    return out


def ratios(summary: list[Result]) -> list[dict[str, Any]]:
    """Conveyor variant / Huey, per scenario: >1 is faster for jobs/s, <1 is faster for latency."""
    by = {(r.system, r.scenario): r for r in summary}
    out = []
    for mine in sorted({r.system for r in summary if r.system.startswith("conveyor")}):
        for peer in ("huey", "huey-2ms"):
            for scenario in ("enqueue", "enqueue_many", "drain", "latency"):
                a, b = by.get((mine, scenario)), by.get((peer, scenario))
                if a is None or b is None:
                    continue
                entry: dict[str, Any] = {"conveyor": mine, "peer": peer, "scenario": scenario}
                if scenario == "latency":
                    if a.p50_ms is None or b.p50_ms is None or a.p99_ms is None or b.p99_ms is None:
                        continue
                    entry["p50_ratio"] = a.p50_ms / b.p50_ms if b.p50_ms else None
                    entry["p99_ratio"] = a.p99_ms / b.p99_ms if b.p99_ms else None
                else:
                    if a.jobs_per_s is None or b.jobs_per_s is None:
                        continue
                    entry["jobs_per_s_ratio"] = a.jobs_per_s / b.jobs_per_s
                out.append(entry)
    return out


def print_ratios(rs: list[dict[str, Any]]) -> None:
    if not rs:
        return
    print(
        "\nRatios, Conveyor / peer (jobs/s: higher is better for Conveyor; latency: lower is better)"
    )
    for e in rs:
        if "jobs_per_s_ratio" in e:
            value = f"jobs/s x{e['jobs_per_s_ratio']:.2f}"
        else:
            value = f"p50 x{fmt(e['p50_ratio'], '.2f')}, p99 x{fmt(e['p99_ratio'], '.2f')}"
        print(f"  {e['conveyor']:<18} / {e['peer']:<9} {e['scenario']:<13} {value}")


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }
    try:
        from importlib.metadata import version

        env["conveyor"] = version("conveyor")
        env["huey"] = version("huey")
    except Exception:
        pass
    return env


# -- main ---------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Benchmark Conveyor on SQLite (optionally against Huey)."
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
        "--peers",
        action="store_true",
        help="also run Huey (SqliteHuey) and a Conveyor run with synchronous=full; "
        "needs `pip install huey`",
    )
    parser.add_argument("--seed", type=int, default=None, help="seed of the random gaps")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "sqlite-latest.json")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.concurrency < 1 or args.rounds < 1 or args.latency_samples < 1:
        parser.error("--jobs, --concurrency, --rounds and --latency-samples must be >= 1")
    if args.peers:
        try:
            import huey  # noqa: F401
        except ImportError:
            parser.error("--peers needs Huey: .venv/bin/pip install huey")

    rng = random.Random(args.seed)
    started = time.perf_counter()
    print(
        f"Conveyor SQLite benchmark: {args.jobs} jobs, concurrency {args.concurrency}, "
        f"{args.rounds} round(s), {args.latency_samples} latency samples"
        + (", peers: huey" if args.peers else ""),
        flush=True,
    )
    all_rounds: list[list[Result]] = []
    for n in range(args.rounds):
        print(f"\nround {n + 1}/{args.rounds}", flush=True)
        print("  " + HEADER)
        with tempfile.TemporaryDirectory(prefix="conveyor-bench-") as d:
            tmp = Path(d)
            results = conveyor_scenarios("conveyor", tmp, args, rng)
            if args.peers:
                # Conveyor's default is FULL, as Huey's SQLite storage (an fsync per commit); the
                # NORMAL column shows what opting out of that durability buys.
                results += conveyor_scenarios(
                    "conveyor-syncnormal", tmp, args, rng, "synchronous=normal"
                )
                results += huey_scenarios(tmp, args, rng)
            all_rounds.append(results)

    summary = summarize(all_rounds)
    peer_ratios = ratios(summary) if args.peers else []
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
        "benchmark": "sqlite_bench",
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "params": {
            "jobs": args.jobs,
            "concurrency": args.concurrency,
            "rounds": args.rounds,
            "latency_samples": args.latency_samples,
            "peers": args.peers,
            "batch": BATCH,
            "seed": args.seed,
        },
        "environment": environment(),
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
