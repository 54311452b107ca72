"""Pick-up latency under a steady load, two versions of Conveyor alternated run by run.

    .venv/bin/python benchmarks/latency_load_ab.py [--stores sqlite,postgres,redis] [--base main]
        [--new WORKTREE] [--rate 1500] [--seconds 5] [--cycles 3] [--nice] [--query ...]

Each run is ``latency_load`` of the harness for one store, cut to what an A/B needs: one
worker process (``bench_conveyor_worker`` / ``bench_redis_conveyor``, concurrency 8) and this
process as the producer, enqueuing one job per call on a fixed schedule of ``--rate`` jobs/s
for ``--seconds`` (``harness.common.paced``). Latency is every job's start minus its enqueue by
the store's clock (``attempted_at - created_at``); on Redis also 1 job in k is a probe, timed by
the wall clock from before its enqueue call to the first line of its body, as the harness does.

The versions are source trees: ``--base`` is a git ref, exported to a temporary directory with
``git archive``; ``--new`` is a checkout's ``src`` (default: this one). The runs alternate
(base, new, base, new, ...), each in a fresh process with that tree first on ``PYTHONPATH``, so a
burst of load from other work on a shared machine falls on both alike. ``--nice`` adds, after
each run, the same run with the producer at nice 19 (set after the worker started, so only the
producer is lowered): on a 2-core machine the producer, the worker and the store share two
cores, and this shows how much of the latency is the producer's claim on them.

SQLite files go to a temporary directory; Redis runs use database 7 (``--redis-db``) under a
prefix of their own and delete their keys at the end (nothing else is touched or flushed). The
probes report on one list of that database (``bench_redis_common.PROBE_KEY``): two runs at once
need two databases.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _stats(samples: list[float]) -> dict[str, float]:
    from sqlite_bench import percentile

    return {"n": len(samples), "p50": percentile(samples, 50), "p90": percentile(samples, 90),
            "p99": percentile(samples, 99), "max": max(samples)}


def _lower_producer(nice: bool) -> None:
    if nice:
        os.setpriority(os.PRIO_PROCESS, 0, 19)


def _load(a: argparse.Namespace, url: str, tmp: Path, noop: Any,
          succeeded: Callable[[], int]) -> float:
    """One worker process on ``url``, a warm-up job, then ``a.rate`` jobs/s for ``a.seconds``
    until every job succeeded; returns the rate the producer reached."""
    from harness.common import paced
    from sqlite_bench import Proc, running, wait_until

    proc = Proc("worker", [sys.executable, "-m", "bench_conveyor_worker", url,
                           "--concurrency", "8"], tmp)
    with running(proc):
        noop.enqueue(-1)  # warm-up: waits for the worker to be up
        wait_until("the warm-up job", lambda: succeeded() >= 1, 60, (proc,))
        _lower_producer(a.nice)
        total, achieved = paced(a.rate, a.seconds, lambda i: noop.enqueue(i))
        wait_until("the load to finish", lambda: succeeded() >= total + 1, 300, (proc,))
    return float(achieved)


def run_sqlite(a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from bench_conveyor_app import make_app

    db = tmp / "load.db"
    url = f"sqlite:///{db}" + (f"?{a.query}" if a.query else "")
    app, noop = make_app(url)
    app.backend  # noqa: B018 - open and migrate before the worker starts

    def succeeded() -> int:
        with contextlib.closing(sqlite3.connect(db)) as conn:
            return int(conn.execute(
                "SELECT count(*) FROM conveyor_jobs WHERE state = 'succeeded'").fetchone()[0])

    achieved = _load(a, url, tmp, noop, succeeded)
    app.close()
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT (attempted_at - created_at) * 1000 FROM conveyor_jobs"
                            " WHERE id > 1").fetchall()
    return {**_stats([r[0] for r in rows]), "achieved": achieved}


def run_postgres(a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    import psycopg
    from bench_conveyor_app import make_app

    schema = f"latab_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(a.postgres, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        try:
            sep = "&" if "?" in a.postgres else "?"
            url = f"{a.postgres}{sep}options=-csearch_path%3D{schema}"
            app, noop = make_app(url)
            app.backend  # noqa: B018 - open and migrate before the worker starts

            def succeeded() -> int:
                row = admin.execute(f'SELECT count(*) FROM "{schema}".conveyor_jobs'
                                    " WHERE state = 'succeeded'").fetchone()
                return int(row[0]) if row else 0

            achieved = _load(a, url, tmp, noop, succeeded)
            app.close()
            rows = admin.execute(
                "SELECT extract(epoch FROM attempted_at - created_at) * 1000"
                f' FROM "{schema}".conveyor_jobs WHERE id > (SELECT min(id) FROM'
                f' "{schema}".conveyor_jobs)').fetchall()
        finally:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
    return {**_stats([float(r[0]) for r in rows]), "achieved": achieved}


def run_redis(a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    import redis
    from bench_redis_common import PROBE_KEY
    from bench_redis_conveyor import make_app
    from harness.common import paced
    from sqlite_bench import Proc, running

    base = f"redis://{a.redis}/{a.redis_db}"
    prefix = f"latab-{uuid.uuid4().hex[:8]}"
    url = f"{base}?prefix={prefix}"
    r = redis.Redis.from_url(base)
    app, noop, probe = make_app(url)
    proc = Proc("worker", [sys.executable, "-m", "bench_redis_conveyor", url, "--concurrency", "8"],
                tmp, env={"BENCH_REDIS_URL": base})
    sent: dict[str, float] = {}
    got: dict[str, float] = {}
    ids: list[int] = []
    probe_ids: dict[str, int] = {}
    every = max(1, int(a.rate * a.seconds) // 300)

    def collect(timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(got) < len(sent):
            proc.check_alive()
            item = r.blpop([PROBE_KEY], timeout=1)
            if item is not None:
                token, at = item[1].decode().split()
                got[token] = float(at)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(sent) - len(got)} probes did not run in {timeout:g}s")

    def send(i: int) -> None:
        if i % every == 0:
            t = time.time()
            ids.append(probe.enqueue(str(i)).id)
            sent[str(i)] = t
            probe_ids[str(i)] = ids[-1]
        else:
            ids.append(noop.enqueue(i).id)

    try:
        r.delete(PROBE_KEY)
        with running(proc):
            sent["warm"] = time.time()
            probe.enqueue("warm")  # waits for the worker to be up
            collect(60)
            sent.clear()
            got.clear()
            _lower_producer(a.nice)
            _, achieved = paced(a.rate, a.seconds, send)
            collect(300)
        pipe = r.pipeline(transaction=False)
        for i in ids:
            pipe.hmget(f"{{{prefix}}}:job:{i}", ["created_at", "attempted_at"])
        times = dict(zip(ids, pipe.execute(), strict=True))
        store = [(float(s) - float(c)) * 1000 for c, s in times.values() if c and s]
        probes = _stats([(got[k] - sent[k]) * 1000 for k in sent])
        # Where a probe's time went, each on one clock (the host's): the producer's enqueue
        # until the store wrote the job, the wait until a claim leased it, and the claim's
        # reply until the task began.
        legs: dict[str, list[float]] = {"enqueue": [], "claim": [], "start": []}
        for k, job_id in probe_ids.items():
            c, s = times[job_id]
            if c and s and k in got:
                legs["enqueue"].append((float(c) - sent[k]) * 1000)
                legs["claim"].append((float(s) - float(c)) * 1000)
                legs["start"].append((got[k] - float(s)) * 1000)
        split = {f"{leg}_{k}": v for leg, xs in legs.items() if xs
                 for k, v in _stats(xs).items() if k in ("p50", "p99")}
        return {**_stats(store), **{f"probe_{k}": v for k, v in probes.items()},
                **split, "achieved": achieved}
    finally:
        app.close()
        for pattern in (f"{{{prefix}}}*", f"{prefix}*"):
            keys = list(r.scan_iter(match=pattern, count=1000))
            for s in range(0, len(keys), 1000):
                r.delete(*keys[s:s + 1000])
        r.close()


def one_run(a: argparse.Namespace) -> None:
    """The child: one run with the tree its PYTHONPATH names; prints one JSON line."""
    with tempfile.TemporaryDirectory(prefix="latab-") as d:
        run = {"sqlite": run_sqlite, "postgres": run_postgres, "redis": run_redis}[a.store]
        out = run(a, Path(d))
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}))


@contextlib.contextmanager
def exported(ref: str) -> Any:
    with tempfile.TemporaryDirectory(prefix="latab-src-") as d:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "src"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", d], input=archive, check=True)
        yield Path(d) / "src"


def parent(a: argparse.Namespace) -> int:
    new_src = Path(a.new).resolve() / "src" if a.new else ROOT / "src"
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with exported(a.base) as base_src:
        trees = {f"base ({a.base})": base_src, f"new ({new_src.parent.name})": new_src}
        for cycle in range(a.cycles):
            for store in a.stores:
                for name, src in trees.items():
                    for nice in ([False, True] if a.nice else [False]):
                        label = name + (" nice 19" if nice else "")
                        argv = [sys.executable, __file__, "--child", "--stores", store,
                                "--rate", str(a.rate), "--seconds", str(a.seconds),
                                "--redis", a.redis, "--redis-db", str(a.redis_db),
                                "--postgres", a.postgres]
                        argv += ["--query", a.query] if a.query else []
                        argv += ["--nice"] if nice else []
                        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                            [str(src), str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])}
                        done = subprocess.run(argv, env=env, capture_output=True, text=True)
                        if done.returncode:
                            raise SystemExit(f"{store} {label} failed:\n{done.stderr[-3000:]}")
                        row = json.loads(done.stdout.strip().splitlines()[-1])
                        results.setdefault((store, label), []).append(row)
                        extra = (f"  probe p50 {row['probe_p50']:.1f} p99 {row['probe_p99']:.1f}"
                                 if "probe_p50" in row else "")
                        extra += "".join(f"  {leg} {row[leg + '_p50']:.2f}/{row[leg + '_p99']:.2f}"
                                         for leg in ("enqueue", "claim", "start")
                                         if leg + "_p50" in row)
                        print(f"[{cycle + 1}/{a.cycles}] {store:6} {label:28} "
                              f"p50 {row['p50']:7.1f} p90 {row['p90']:7.1f} p99 {row['p99']:7.1f}"
                              f" ms  producer {row['achieved']:,.0f} jobs/s{extra}", flush=True)
    print(f"\nmedians over {a.cycles} run(s), offered {a.rate:,.0f} jobs/s for {a.seconds:g} s:")
    for (store, label), rows in results.items():
        med = {k: statistics.median(r[k] for r in rows) for k in ("p50", "p90", "p99", "achieved")}
        each = ", ".join(f"{r['p99']:.1f}" for r in rows)
        print(f"  {store:6} {label:28} p50 {med['p50']:7.1f} p90 {med['p90']:7.1f} "
              f"p99 {med['p99']:7.1f} ms  producer {med['achieved']:,.0f} jobs/s  "
              f"(p99 of each run: {each})")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stores", default="sqlite,redis")
    p.add_argument("--base", default="main", help="git ref of the base version (default main)")
    p.add_argument("--new", default="", help="a checkout whose src/ is the new version "
                   "(default: this one)")
    p.add_argument("--rate", type=float, default=1500.0, help="jobs/s offered (default 1500)")
    p.add_argument("--seconds", type=float, default=5.0, help="load per run (default 5)")
    p.add_argument("--cycles", type=int, default=3, help="runs of each version (default 3)")
    p.add_argument("--nice", action="store_true", help="also run each with the producer at nice 19")
    p.add_argument("--query", default="", help="SQLite URL options, e.g. synchronous=normal")
    p.add_argument("--redis", default="127.0.0.1:6379")
    p.add_argument("--redis-db", type=int, default=7)
    p.add_argument("--postgres", default="postgresql://127.0.0.1:5432/test",
                   help="PostgreSQL runs make a schema of their own there and drop it after")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.stores = [s.strip() for s in a.stores.split(",") if s.strip()]
    if set(a.stores) - {"sqlite", "postgres", "redis"}:
        p.error("--stores: sqlite, postgres and/or redis")
    if a.child:
        if str(HERE) not in sys.path:
            sys.path.insert(0, str(HERE))
        a.store = a.stores[0]
        one_run(a)
        return 0
    return parent(a)


if __name__ == "__main__":
    sys.exit(main())
