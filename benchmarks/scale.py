"""Scale curves: how Conveyor's costs behave as its store grows (issue 9, deliverable 2).

    python benchmarks/scale.py [--stores sqlite,postgres,redis] [--sizes 1000,100000,1000000]
        [--drain 20000] [--claims 1000] [--finished 100000] [--memory-jobs 1000000] [--quick]

Per store, every phase runs on a fresh store (SQLite: a new file in a temporary directory, deleted
after the phase; PostgreSQL: a new database, ``CREATE DATABASE`` through ``--pg-url``, dropped after
the phase; Redis: one database of 9-15, ``--redis-db``, FLUSHed after every phase and at the end; the
script refuses a database holding keys it did not write, and never touches database 0).

1. A backlog of S waiting jobs, for each S of ``--sizes``:
   - fill: ``enqueue_many``, 1000 jobs per call; jobs/s over the whole fill and over its last 10 %.
   - claims: no worker running; ``--claims`` times ``backend.claim(queue, 8)`` then
     ``backend.ack_many`` of what it got, then as many ``backend.ack_and_claim`` calls (the call a
     busy worker makes); every call timed, p50/p99 in ms. After each call the script enqueues as
     many jobs as it took (untimed), so the backlog stays at S.
   - drain: ONE worker process (``python -m bench_conveyor_worker URL --concurrency 8``) runs
     ``--drain`` jobs off the top of the backlog, then gets SIGTERM. jobs/s = jobs / (the last of
     those jobs' ``finished_at`` - the first ``attempted_at``), both from the store's clock. A
     backlog smaller than ``--drain`` is drained and refilled (S jobs in one go) until ``--drain``
     jobs have run: jobs/s = jobs / the sum of the rounds' windows.
2. Retention: ``--finished`` succeeded jobs (``enqueue_many``, then ``claim`` 1000 + ``ack_many`` at
   a time, by this script) with a ``--finished-backlog`` backlog beside them: the same claims and
   drain. Finished jobs must not slow claims.
3. Memory: one worker process runs ``--memory-jobs`` jobs; the script keeps about
   ``--memory-backlog`` jobs waiting (``enqueue_many`` as it drains) and reads the worker's RSS
   (``VmRSS`` in ``/proc/<pid>/status``) every ``--memory-interval`` s. Baseline: the first sample
   after 10 % of the jobs; growth = end / baseline - 1.

PostgreSQL gets ``VACUUM ANALYZE conveyor_jobs`` after each fill (standing for autovacuum having
caught up with the bulk writes). Output: ``benchmarks/results/<date>-scale.md`` (tables, machine,
versions), the raw numbers and memory samples in ``<date>-scale.json`` (git-ignored) and, if
matplotlib is importable (``benchmarks/.venv-peers``), ``<date>-scale.png``; ``--quick`` writes
``<date>-scale-quick.*`` (git-ignored), a run of some stores ``<date>-scale-<stores>.*``.
``--replot JSON`` writes the markdown and chart again from a JSON file. The report is rewritten
after every store, so a failing store loses only itself.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS_DIR = HERE / "results"
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
# the worker processes import bench_conveyor_worker from benchmarks/ (Proc adds it too)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]
)

from bench_conveyor_app import make_app  # noqa: E402
from sqlite_bench import (  # noqa: E402
    BATCH,
    Proc,
    drain_timeout,
    percentile,
    running,
    sqlite_url,
    wait_until,
)

from conveyor import JobState  # noqa: E402
from conveyor.backends.base import Backend, Lease  # noqa: E402

STORES = ("sqlite", "postgres", "redis")
QUEUE = "default"
CLAIM_LIMIT = 8  # what one claim asks for: the worker's concurrency here
FINISH_BATCH = 1000  # retention fill: jobs claimed and acked per call
WORKER_ID = "scale-bench"
LEASE_S = 120.0
MARKER = "conveyor-scale-bench:owner"  # its own key: run.py's databases (and marker) are not ours
DEFAULT_PG = os.environ.get("CONVEYOR_BENCH_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/test")
PACKAGES = ("conveyor", "redis", "hiredis", "psycopg", "psycopg-pool", "matplotlib")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Refused(Exception):
    """A store the script must not use (a Redis database holding someone else's keys)."""


# -- the stores -------------------------------------------------------------------------------
class Store:
    """Where the phases run: ``phase()`` yields the URL of a fresh, empty store."""

    name: str

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a

    def setup(self) -> None:
        pass

    def teardown(self) -> None:
        pass

    def phase(self, label: str) -> contextlib.AbstractContextManager[str]:
        raise NotImplementedError

    def after_fill(self, url: str) -> None:
        pass

    def size_mb(self, url: str) -> float | None:
        return None

    def environment(self) -> dict[str, Any]:
        return {}


class SqliteStore(Store):
    name = "sqlite"

    def setup(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="conveyor-scale-"))

    def teardown(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    @contextlib.contextmanager
    def phase(self, label: str) -> Iterator[str]:
        db = self.tmp / f"{label}.db"
        try:
            yield sqlite_url(db)
        finally:
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(f"{db}{suffix}").unlink(missing_ok=True)

    def size_mb(self, url: str) -> float | None:
        db = url.removeprefix("sqlite:///").split("?")[0]
        paths = [Path(db), Path(db + "-wal")]
        return sum(p.stat().st_size for p in paths if p.exists()) / 1e6

    def environment(self) -> dict[str, Any]:
        return {
            "sqlite": sqlite3.sqlite_version,
            "sqlite durability": "Conveyor's default, WAL with synchronous=NORMAL",
        }


class PostgresStore(Store):
    name = "postgres"

    def setup(self) -> None:
        import psycopg

        with psycopg.connect(self.a.pg_url, connect_timeout=5) as conn:
            self.settings = {
                f"postgresql {s}": conn.execute(f"SHOW {s}").fetchone()[0]  # type: ignore[index]
                for s in ("server_version", "fsync", "synchronous_commit", "shared_buffers")
            }

    def phase(self, label: str) -> contextlib.AbstractContextManager[str]:
        from postgres_bench import fresh_database  # CREATE DATABASE, and DROP ... WITH (FORCE)

        return fresh_database(self.a.pg_url, f"scale_{label}")

    def after_fill(self, url: str) -> None:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE conveyor_jobs")

    def size_mb(self, url: str) -> float | None:
        import psycopg

        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
        return row[0] / 1e6 if row else None

    def environment(self) -> dict[str, Any]:
        return dict(self.settings)


class RedisStore(Store):
    name = "redis"

    def client(self) -> Any:
        import redis

        return redis.Redis.from_url(
            f"redis://{self.a.redis}/{self.a.redis_db}",
            socket_timeout=120,
            socket_connect_timeout=2,
        )

    def setup(self) -> None:
        db = self.a.redis_db
        if not 9 <= db <= 15:
            raise Refused(f"--redis-db {db}: use one of the databases 9-15")
        self.r = self.client()
        size = self.r.dbsize()
        if size and not self.r.exists(MARKER):
            self.r.close()
            raise Refused(
                f"Redis database {db} on {self.a.redis} holds {size} keys this script did not write; "
                "it FLUSHes the database it uses, so empty that one first or pick another (--redis-db)"
            )
        self.owned = True
        self.r.flushdb()
        self.r.set(MARKER, "1")
        info = self.r.info("server")
        persistence = self.r.info("persistence")
        self.settings: dict[str, Any] = {
            "redis server": info.get("redis_version"),
            "redis appendonly": persistence.get("aof_enabled"),
            "redis database": f"{db} (FLUSHed after every phase and at the end)",
        }
        with contextlib.suppress(Exception):
            self.settings["redis save"] = repr(self.r.config_get("save").get("save"))

    def teardown(self) -> None:
        r = getattr(self, "r", None)
        if r is None:
            return
        try:
            if r.exists(MARKER):  # still ours: nobody else wrote in between
                r.flushdb()
        finally:
            r.close()

    @contextlib.contextmanager
    def phase(self, label: str) -> Iterator[str]:
        prefix = f"scale-{label}-{uuid.uuid4().hex[:6]}"
        try:
            yield f"redis://{self.a.redis}/{self.a.redis_db}?prefix={prefix}"
        finally:
            if self.r.exists(MARKER):
                self.r.flushdb()  # frees the memory of a million jobs before the next phase
                self.r.set(MARKER, "1")

    def size_mb(self, url: str) -> float | None:
        return float(self.r.info("memory")["used_memory"]) / 1e6

    def environment(self) -> dict[str, Any]:
        return dict(self.settings)


STORE_CLASSES: dict[str, type[Store]] = {
    "sqlite": SqliteStore,
    "postgres": PostgresStore,
    "redis": RedisStore,
}


# -- measurements ------------------------------------------------------------------------------
def fill(noop: Any, n: int, start: int = 0) -> tuple[list[int], dict[str, Any]]:
    """``n`` jobs with ``enqueue_many``, BATCH per call; their ids in order, and the rates."""
    ids: list[int] = []
    times: list[tuple[int, float]] = []
    for s in range(start, start + n, BATCH):
        calls = [(i,) for i in range(s, min(start + n, s + BATCH))]
        t0 = time.perf_counter()
        jobs = noop.enqueue_many(calls)
        times.append((len(calls), time.perf_counter() - t0))
        ids += [j.id for j in jobs]
    total = sum(dt for _, dt in times)
    tail = times[-max(1, len(times) // 10) :]
    return ids, {
        "jobs": n,
        "seconds": total,
        "jobs_per_s": n / total if total else None,
        "last10_jobs_per_s": sum(k for k, _ in tail) / sum(dt for _, dt in tail),
    }


def warm_up(b: Backend, noop: Any) -> None:
    """One job enqueued, claimed and acked, untimed: the first call of each kind (prepared
    statements, Lua scripts, pools) is not part of any measurement, and the job is not waiting."""
    noop.enqueue_many([(-1,)])
    jobs = b.claim(QUEUE, 1, worker_id=WORKER_ID, lease_s=LEASE_S)
    b.ack_many([(Lease(j.id, j.lease_token), None) for j in jobs])


def stats_ms(samples: list[float]) -> dict[str, Any]:
    return {
        "calls": len(samples),
        "p50_ms": percentile(samples, 50) if samples else None,
        "p99_ms": percentile(samples, 99) if samples else None,
        "max_ms": max(samples) if samples else None,
        "samples_ms": [round(x, 4) for x in samples],
    }


def measure_claims(
    b: Backend, noop: Any, order: list[int], n: int
) -> tuple[dict[str, Any], set[int]]:
    """``n`` claim + ack_many pairs, then ``n`` ack_and_claim calls, each timed; the backlog is
    topped up (untimed) after each call. Appends the new jobs' ids to ``order``; returns the
    timings and the ids the calls took."""
    claim_ms: list[float] = []
    ack_ms: list[float] = []
    both_ms: list[float] = []
    taken: set[int] = set()
    extra = iter(range(10**9, 2 * 10**9))
    short = 0

    def replenish(k: int) -> None:
        if k:
            order.extend(j.id for j in noop.enqueue_many([(next(extra),) for _ in range(k)]))

    def leases(jobs: list[Any]) -> list[tuple[Lease, str | None]]:
        return [(Lease(j.id, j.lease_token), None) for j in jobs]

    for i in range(n + 1):  # the first pair is a warm-up, not counted
        t0 = time.perf_counter()
        jobs = b.claim(QUEUE, CLAIM_LIMIT, worker_id=WORKER_ID, lease_s=LEASE_S)
        t1 = time.perf_counter()
        held = b.ack_many(leases(jobs))
        t2 = time.perf_counter()
        assert all(held), "an ack was refused"
        if i:
            claim_ms.append((t1 - t0) * 1000)
            ack_ms.append((t2 - t1) * 1000)
        short += len(jobs) < CLAIM_LIMIT
        taken.update(j.id for j in jobs)
        replenish(len(jobs))
    pending: list[tuple[Lease, str | None]] = []
    for i in range(n + 1):
        t0 = time.perf_counter()
        held, jobs = b.ack_and_claim(
            pending, QUEUE, CLAIM_LIMIT, worker_id=WORKER_ID, lease_s=LEASE_S
        )
        t1 = time.perf_counter()
        assert all(held), "an ack was refused"
        if i:
            both_ms.append((t1 - t0) * 1000)
        short += len(jobs) < CLAIM_LIMIT
        taken.update(j.id for j in jobs)
        replenish(len(jobs))
        pending = leases(jobs)
    if pending:
        b.ack_many(pending)
    return {
        "claim": stats_ms(claim_ms),
        "ack_many": stats_ms(ack_ms),
        "ack_and_claim": stats_ms(both_ms),
        "short_claims": short,
    }, taken


def job_succeeded(b: Backend, job_id: int) -> bool:
    job = b.get(job_id)
    return job is not None and job.state == JobState.SUCCEEDED


def queue_counts(b: Backend) -> tuple[int, int]:
    """(available, running) of the queue, from the indexes over unfinished jobs only."""
    for q in b.stats(finished=False).queues:
        if q.queue == QUEUE:
            return q.available + q.scheduled, q.running
    return 0, 0


def succeeded_among(b: Backend, ids: set[int]) -> list[tuple[float, float]]:
    """(attempted_at, finished_at) of the succeeded jobs among ``ids``, read with ``list_jobs``
    (newest first, stopping below the smallest id)."""
    lowest = min(ids)
    out: list[tuple[float, float]] = []
    cursor: int | None = None
    while True:
        page = b.list_jobs(state=JobState.SUCCEEDED, queue=QUEUE, cursor=cursor, limit=1000)
        for j in page.jobs:
            if j.id in ids and j.attempted_at is not None and j.finished_at is not None:
                out.append((j.attempted_at, j.finished_at))
        if page.next_cursor is None or page.next_cursor < lowest:
            return out
        cursor = page.next_cursor


def worker_proc(name: str, url: str, a: argparse.Namespace, tmp: Path) -> Proc:
    return Proc(
        name,
        [sys.executable, "-m", "bench_conveyor_worker", url, "--concurrency", str(a.concurrency)],
        tmp,
    )


def measure_drain(
    b: Backend,
    noop: Any,
    url: str,
    backlog: list[int],
    size: int,
    label: str,
    a: argparse.Namespace,
    tmp: Path,
) -> dict[str, Any]:
    """One worker process runs ``a.drain`` jobs off the top of ``backlog`` (ids in claim order),
    refilling a backlog it emptied with ``size`` new jobs until ``a.drain`` jobs have run."""
    rounds: list[dict[str, Any]] = []
    done = 0
    ids = backlog
    next_arg = 2 * 10**9
    worker = worker_proc(f"{label}-worker", url, a, tmp)
    with running(worker):
        while True:
            want = min(a.drain - done, len(ids))
            whole = want == len(ids)
            target = ids[want - 1]  # the want-th job in claim order
            wait_until(
                f"{want} jobs of the backlog to run",
                lambda t=target: job_succeeded(b, t),
                drain_timeout(want),
                (worker,),
                interval=0.1,
            )
            if whole:  # the worker may still be finishing the jobs claimed just before it
                wait_until("the backlog to empty", lambda: queue_counts(b) == (0, 0), 60, (worker,))
            rows = sorted(succeeded_among(b, set(ids)), key=lambda r: r[1])
            first = min(r[0] for r in rows)
            rows = rows[:want]
            window = rows[-1][1] - first
            rounds.append({"jobs": len(rows), "window_s": window, "backlog_at_start": len(ids)})
            done += len(rows)
            if not whole or done >= a.drain:
                break
            # the backlog is empty: the next round starts from a fresh one of the same size
            ids, _ = fill(noop, size, next_arg)
            next_arg += size
    total = sum(r["window_s"] for r in rounds)
    jobs = sum(r["jobs"] for r in rounds)
    return {
        "jobs": jobs,
        "window_s": total,
        "jobs_per_s": jobs / total if total > 0 else None,
        "rounds": rounds,
        "short": jobs < a.drain,
    }


def backlog_phase(
    store: Store, a: argparse.Namespace, tmp: Path, label: str, size: int, finished: int = 0
) -> dict[str, Any]:
    started = time.perf_counter()
    with store.phase(label) as url:
        app, noop = make_app(url)
        try:
            b = app.backend
            b.now()  # open and migrate outside the timing
            out: dict[str, Any] = {"backlog": size, "finished": finished}
            warm_up(b, noop)
            if finished:
                _, out["finished_fill"] = fill(noop, finished, 0)
                t0 = time.perf_counter()
                made = 0
                while made < finished:
                    jobs = b.claim(QUEUE, FINISH_BATCH, worker_id=WORKER_ID, lease_s=LEASE_S)
                    if not jobs:
                        break
                    assert all(b.ack_many([(Lease(j.id, j.lease_token), None) for j in jobs]))
                    made += len(jobs)
                dt = time.perf_counter() - t0
                assert made == finished, (made, finished)
                out["finished_claim_ack_jobs_per_s"] = made / dt
                log(
                    f"  {store.name} {label}: {finished:,} jobs succeeded ({made / dt:,.0f} jobs/s)"
                )
            order, out["fill"] = fill(noop, size, finished)
            log(
                f"  {store.name} {label}: enqueue_many {size:,} jobs at "
                f"{out['fill']['jobs_per_s']:,.0f} jobs/s (last 10 %: {out['fill']['last10_jobs_per_s']:,.0f})"
            )
            t0 = time.perf_counter()
            store.after_fill(url)
            out["after_fill_s"] = time.perf_counter() - t0
            out["store_mb"] = store.size_mb(url)
            out["claims"], taken = measure_claims(b, noop, order, a.claims)
            c = out["claims"]
            log(
                f"  {store.name} {label}: claim p50/p99 {c['claim']['p50_ms']:.2f}/{c['claim']['p99_ms']:.2f} ms, "
                f"ack_many {c['ack_many']['p50_ms']:.2f}/{c['ack_many']['p99_ms']:.2f} ms, "
                f"ack_and_claim {c['ack_and_claim']['p50_ms']:.2f}/{c['ack_and_claim']['p99_ms']:.2f} ms"
            )
            backlog = [i for i in order if i not in taken]
            assert len(backlog) == size, (len(backlog), size)
            out["drain"] = measure_drain(b, noop, url, backlog, size, label, a, tmp)
            d = out["drain"]
            log(
                f"  {store.name} {label}: drain {d['jobs']:,} jobs at {d['jobs_per_s']:,.0f} jobs/s "
                f"({len(d['rounds'])} round(s))"
            )
            out["elapsed_s"] = time.perf_counter() - started
            return out
        finally:
            app.close()


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM (peak RSS) in kB from /proc/<pid>/status."""
    out = {}
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(rest.split()[0])
    return out


def memory_phase(store: Store, a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    total, keep = a.memory_jobs, a.memory_backlog
    with store.phase("memory") as url:
        app, noop = make_app(url)
        try:
            b = app.backend
            b.now()
            enqueued = 0

            def top_up(waiting: int) -> int:
                nonlocal enqueued
                while enqueued < total and waiting < keep:
                    k = min(BATCH, total - enqueued)
                    noop.enqueue_many([(enqueued + i,) for i in range(k)])
                    enqueued += k
                    waiting += k
                return waiting

            top_up(0)
            store.after_fill(url)
            samples: list[dict[str, Any]] = []
            worker = worker_proc("memory-worker", url, a, tmp)
            pid = worker.popen.pid
            with running(worker):
                t0 = time.monotonic()
                next_sample = t0
                progress = (0, t0)
                while True:
                    worker.check_alive()
                    waiting, busy = queue_counts(b)
                    done = enqueued - waiting - busy
                    now = time.monotonic()
                    finished = enqueued >= total and waiting + busy == 0
                    if now >= next_sample or finished:
                        st = proc_status(pid)
                        samples.append(
                            {
                                "t_s": round(now - t0, 2),
                                "jobs_done": done,
                                "rss_kb": st.get("VmRSS"),
                                "hwm_kb": st.get("VmHWM"),
                                "waiting": waiting,
                            }
                        )
                        next_sample = now + a.memory_interval
                        if len(samples) % 10 == 0:
                            log(
                                f"  {store.name} memory: {done:,}/{total:,} jobs, RSS {st.get('VmRSS', 0) / 1024:.1f} MB"
                            )
                    if finished:
                        break
                    if done > progress[0]:
                        progress = (done, now)
                    elif now - progress[1] > 120:
                        raise TimeoutError(
                            f"memory phase: no job finished for 120 s ({done:,} done)"
                        )
                    top_up(waiting)
                    time.sleep(0.25)
                elapsed = time.monotonic() - t0
            store_mb = store.size_mb(url)
        finally:
            app.close()
    baseline = next((s for s in samples if s["jobs_done"] >= total / 10), samples[0])
    end = samples[-1]
    out = {
        "jobs": total,
        "backlog_kept": keep,
        "interval_s": a.memory_interval,
        "elapsed_s": elapsed,
        "jobs_per_s_wall": total / elapsed if elapsed else None,
        "baseline": baseline,
        "end": end,
        "peak_rss_kb": max((s["hwm_kb"] or 0) for s in samples),
        "growth_pct": (end["rss_kb"] / baseline["rss_kb"] - 1) * 100
        if baseline["rss_kb"] and end["rss_kb"]
        else None,
        "store_mb": store_mb,
        "samples": samples,
    }
    log(
        f"  {store.name} memory: RSS {baseline['rss_kb'] / 1024:.1f} MB after {baseline['jobs_done']:,} jobs, "
        f"{end['rss_kb'] / 1024:.1f} MB after {end['jobs_done']:,} ({out['growth_pct']:+.1f} %)"
    )
    return out


def run_store(name: str, a: argparse.Namespace) -> dict[str, Any]:
    store = STORE_CLASSES[name](a)
    started = time.perf_counter()
    result: dict[str, Any] = {"store": name, "load_start": os.getloadavg()[0]}
    log(f"{name}: start (load average {result['load_start']:.2f})")
    store.setup()
    try:
        with tempfile.TemporaryDirectory(prefix=f"conveyor-scale-{name}-logs-") as d:
            tmp = Path(d)
            result["sizes"] = []
            for size in a.sizes:
                result["sizes"].append(backlog_phase(store, a, tmp, f"backlog{size}", size))
            if a.finished:
                result["retention"] = backlog_phase(
                    store, a, tmp, "retention", a.finished_backlog, a.finished
                )
            if a.memory_jobs:
                result["memory"] = memory_phase(store, a, tmp)
        result["environment"] = store.environment()
    finally:
        store.teardown()
    result["load_end"] = os.getloadavg()[0]
    result["elapsed_s"] = time.perf_counter() - started
    log(f"{name}: done in {result['elapsed_s']:.0f} s (load average {result['load_end']:.2f})")
    return result


# -- report ------------------------------------------------------------------------------------
def f0(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def f1(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def f2(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def pair(c: dict[str, Any] | None) -> str:
    return "-" if not c else f"{f2(c['p50_ms'])} / {f2(c['p99_ms'])}"


def size_row(label: str, r: dict[str, Any]) -> str:
    c, d = r["claims"], r["drain"]
    drained = f"{f0(d['jobs_per_s'])} ({d['jobs']:,} jobs"
    drained += f", {len(d['rounds'])} rounds)" if len(d["rounds"]) > 1 else ")"
    return (
        f"| {label} | {f0(r['fill']['jobs_per_s'])} ({f0(r['fill']['last10_jobs_per_s'])}) | "
        f"{pair(c['claim'])} | {pair(c['ack_many'])} | {pair(c['ack_and_claim'])} | {drained} | "
        f"{f1(r.get('store_mb'))} |"
    )


def ratio(new: float | None, old: float | None) -> str:
    return "-" if new is None or not old else f"x{new / old:.2f}"


def verdicts(res: dict[str, Any]) -> list[str]:
    """The growth in one line per comparison: the largest backlog against the smallest, and the
    retention row against the plain backlog of the same size."""
    out = []
    sizes = res.get("sizes") or []

    def compare(hi: dict[str, Any], lo: dict[str, Any]) -> str:
        c, base = hi["claims"], lo["claims"]
        return (
            f"claim p50 {ratio(c['claim']['p50_ms'], base['claim']['p50_ms'])}, "
            f"p99 {ratio(c['claim']['p99_ms'], base['claim']['p99_ms'])}; "
            f"ack_and_claim p50 {ratio(c['ack_and_claim']['p50_ms'], base['ack_and_claim']['p50_ms'])}, "
            f"p99 {ratio(c['ack_and_claim']['p99_ms'], base['ack_and_claim']['p99_ms'])}; "
            f"drain jobs/s {ratio(hi['drain']['jobs_per_s'], lo['drain']['jobs_per_s'])}; "
            f"enqueue_many jobs/s {ratio(hi['fill']['jobs_per_s'], lo['fill']['jobs_per_s'])}"
        )

    if len(sizes) >= 2:
        lo, hi = sizes[0], sizes[-1]
        out.append(
            f"- {hi['backlog']:,} waiting against {lo['backlog']:,} waiting: {compare(hi, lo)}."
        )
    ret = res.get("retention")
    same = next((r for r in sizes if r["backlog"] == ret["backlog"]), None) if ret else None
    if ret and same:
        out.append(
            f"- {ret['backlog']:,} waiting + {ret['finished']:,} succeeded against {same['backlog']:,} "
            f"waiting alone: {compare(ret, same)}."
        )
    return [*out, ""] if out else []


def store_section(res: dict[str, Any]) -> list[str]:
    name = res["store"]
    lines = [f"## {name}", ""]
    if res.get("error"):
        return [*lines, f"**Failed**: `{res['error']}`", ""]
    lines += [
        "| store holds | enqueue_many jobs/s (last 10 %) | claim(8) p50 / p99 ms | ack_many(8) p50 / p99 ms "
        "| ack_and_claim(8) p50 / p99 ms | drain jobs/s (jobs) | store MB |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res.get("sizes", []):
        lines.append(size_row(f"{r['backlog']:,} waiting", r))
    ret = res.get("retention")
    if ret:
        lines.append(size_row(f"{ret['backlog']:,} waiting + {ret['finished']:,} succeeded", ret))
    lines.append("")
    lines += verdicts(res)
    if ret:
        lines += [
            f"Retention row: the {ret['finished']:,} succeeded jobs were enqueued at "
            f"{f0(ret['finished_fill']['jobs_per_s'])} jobs/s and claimed + acked ({FINISH_BATCH} per call) at "
            f"{f0(ret['finished_claim_ack_jobs_per_s'])} jobs/s; the enqueue_many column is the backlog's.",
            "",
        ]
    m = res.get("memory")
    if m:
        b, e = m["baseline"], m["end"]
        lines += [
            "| worker memory | jobs | waiting kept | RSS at baseline | RSS at end | growth | peak RSS | jobs/s (wall, incl. start) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
            f"| 1 process, concurrency {res['concurrency']} | {m['jobs']:,} | ~{m['backlog_kept']:,} | "
            f"{b['rss_kb'] / 1024:.1f} MB (after {b['jobs_done']:,} jobs) | "
            f"{e['rss_kb'] / 1024:.1f} MB (after {e['jobs_done']:,}) | {m['growth_pct']:+.1f} % | "
            f"{m['peak_rss_kb'] / 1024:.1f} MB | {f0(m['jobs_per_s_wall'])} |",
            "",
        ]
        step = max(1, len(m["samples"]) // 12)
        picked = m["samples"][::step]
        if picked[-1] is not m["samples"][-1]:
            picked.append(m["samples"][-1])
        lines += [
            "<details><summary>RSS samples (every "
            f"{step * m['interval_s']:g} s here; all {len(m['samples'])} in the JSON)</summary>",
            "",
            "| s | jobs done | RSS MB | waiting |",
            "|---:|---:|---:|---:|",
            *(
                f"| {s['t_s']:.0f} | {s['jobs_done']:,} | {(s['rss_kb'] or 0) / 1024:.1f} | {s['waiting']:,} |"
                for s in picked
            ),
            "",
            "</details>",
            "",
        ]
    if name == "redis":
        lines += [
            "`store MB` on Redis: `used_memory` of the whole server (other databases count too).",
            "",
        ]
    env = res.get("environment", {})
    lines += [
        f"Load average (1 min) {res['load_start']:.2f} at start, {res['load_end']:.2f} at end; "
        f"{res['elapsed_s']:.0f} s for this store."
        + "".join(f" {k}: {v}." for k, v in env.items()),
        "",
    ]
    return lines


def markdown(doc: dict[str, Any], chart: Path | None) -> str:
    p = doc["params"]
    lines = [f"# Scale curves, {doc['date']}", "", f"Command: `{doc['command']}`", ""]
    lines += [
        f"{'Quick run (--quick)' if p['quick'] else 'Run'}: backlogs of "
        + ", ".join(f"{s:,}" for s in p["sizes"])
        + f" waiting jobs (filled with enqueue_many, {BATCH} per call); {p['claims']:,} timed claim + "
        f"ack_many pairs and {p['claims']:,} ack_and_claim calls per backlog (asking for {CLAIM_LIMIT} jobs "
        f"each, no worker running, the backlog topped up after each call); then ONE worker process "
        f"(concurrency {p['concurrency']}) runs {p['drain']:,} jobs off the top, jobs/s from the store's "
        f"clock (first attempted_at to the last finished_at). A backlog smaller than that is drained and "
        f"refilled until {p['drain']:,} jobs have run (the rounds' windows are summed). Retention: "
        f"{p['finished']:,} succeeded jobs beside a {p['finished_backlog']:,}-job backlog. Memory: one worker "
        f"process through {p['memory_jobs']:,} jobs with about {p['memory_backlog']:,} kept waiting; RSS "
        f"(VmRSS) every {p['memory_interval']:g} s, baseline = the first sample after 10 % of the jobs.",
        "",
        "Every phase runs on a fresh store. Claims and acks are timed in this process (wall clock, one "
        "call each, including the round trip); the drain's worker process runs the no-op task of "
        "`bench_conveyor_app.py`. PostgreSQL gets `VACUUM ANALYZE conveyor_jobs` after each fill. "
        "Everything shares the machine below: read differences under ~30 % as noise.",
        "",
    ]
    if chart is not None:
        lines += [f"![scale curves]({chart.name})", ""]
    for res in doc["stores"]:
        lines += store_section(res)
    lines += ["## Machine and versions", ""]
    lines += [f"- {k}: {v}" for k, v in doc["machine"].items()]
    lines.append("")
    return "\n".join(lines)


def draw(doc: dict[str, Any], path: Path) -> Path | None:
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    (ax_enq, ax_claim), (ax_drain, ax_mem) = axes
    colors = {"sqlite": "tab:blue", "postgres": "tab:green", "redis": "tab:red"}
    for res in doc["stores"]:
        name = res["store"]
        col = colors.get(name)
        sizes = res.get("sizes") or []
        xs = [r["backlog"] for r in sizes]
        ret = res.get("retention")
        if xs:
            ax_enq.plot(xs, [r["fill"]["jobs_per_s"] for r in sizes], "o-", color=col, label=name)
            ax_claim.plot(
                xs,
                [r["claims"]["claim"]["p50_ms"] for r in sizes],
                "o-",
                color=col,
                label=f"{name} claim p50",
            )
            ax_claim.plot(
                xs,
                [r["claims"]["claim"]["p99_ms"] for r in sizes],
                "o--",
                color=col,
                alpha=0.6,
                label=f"{name} claim p99",
            )
            ax_claim.plot(
                xs,
                [r["claims"]["ack_and_claim"]["p50_ms"] for r in sizes],
                "s:",
                color=col,
                alpha=0.8,
                label=f"{name} ack_and_claim p50",
            )
            ax_drain.plot(
                xs, [r["drain"]["jobs_per_s"] for r in sizes], "o-", color=col, label=name
            )
        if ret:
            lbl = f"{name}: + {ret['finished']:,} succeeded"
            ax_claim.plot(
                [ret["backlog"]],
                [ret["claims"]["claim"]["p50_ms"]],
                "D",
                color=col,
                mfc="none",
                ms=9,
                label=lbl + " (claim p50)",
            )
            ax_drain.plot(
                [ret["backlog"]],
                [ret["drain"]["jobs_per_s"]],
                "D",
                color=col,
                mfc="none",
                ms=9,
                label=lbl,
            )
        m = res.get("memory")
        if m:
            pts = [s for s in m["samples"] if s["rss_kb"] and s["jobs_done"] > 0]  # worker up
            ax_mem.plot(
                [s["jobs_done"] for s in pts],
                [s["rss_kb"] / 1024 for s in pts],
                "-",
                color=col,
                label=f"{name} ({m['growth_pct']:+.1f} % after 10 %)",
            )
    ticks = sorted({r["backlog"] for res in doc["stores"] for r in res.get("sizes") or []})
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    for ax, title, ylabel in (
        (ax_enq, "bulk enqueue (enqueue_many, 1000/call)", "jobs/s"),
        (ax_claim, f"claim({CLAIM_LIMIT}) per call, no worker (log scale; lower is better)", "ms"),
        (ax_drain, "drain, 1 worker process (higher is better)", "jobs/s"),
    ):
        ax.set_xscale("log")
        if ticks:
            ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("waiting jobs in the store")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    ax_enq.set_ylim(bottom=0)
    ax_drain.set_ylim(bottom=0)
    ax_claim.set_yscale("log")
    ax_claim.legend(fontsize=6, ncol=2)
    ax_claim.yaxis.set_major_formatter(plain)
    ax_claim.yaxis.set_minor_formatter(plain)
    ax_mem.set_ylim(bottom=0)
    ax_mem.set_xlabel("jobs run by the worker")
    ax_mem.set_ylabel("worker RSS, MB")
    ax_mem.set_title("worker memory")
    ax_mem.grid(alpha=0.3)
    ax_mem.legend(fontsize=7)
    fig.suptitle(
        f"Conveyor scale curves, {doc['date']}" + (" (quick run)" if doc["params"]["quick"] else "")
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def write(doc: dict[str, Any], stem: Path) -> None:
    json_path = stem.with_suffix(".json")
    tmp = stem.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(json_path)
    chart = draw(doc, stem.with_suffix(".png"))
    stem.with_suffix(".md").write_text(markdown(doc, chart))
    print(
        f"wrote {stem.with_suffix('.md')}, {json_path.name}"
        + (
            f", {chart.name}"
            if chart
            else " (no chart: matplotlib is not importable here; "
            f"benchmarks/.venv-peers/bin/python benchmarks/scale.py --replot {json_path} draws it)"
        ),
        flush=True,
    )


def machine_info() -> dict[str, Any]:
    from harness.main import machine

    env = machine()
    versions = []
    for pkg in PACKAGES:
        try:
            versions.append(f"{pkg} {version(pkg)}")
        except PackageNotFoundError:
            versions.append(f"{pkg} (not installed)")
    env["packages"] = ", ".join(versions)
    env["python executable"] = sys.executable
    return env


# -- main --------------------------------------------------------------------------------------
def ints(text: str) -> list[int]:
    return [int(x.replace("_", "")) for x in text.split(",") if x.strip()]


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python benchmarks/scale.py",
        description="How Conveyor's enqueue, claim, drain and worker memory behave as the store grows.",
    )
    p.add_argument(
        "--stores", default=",".join(STORES), help="comma-separated subset of sqlite,postgres,redis"
    )
    p.add_argument(
        "--sizes",
        type=ints,
        default=None,
        help="backlog sizes, waiting jobs (default 1000,100000,1000000; --quick 1000,10000)",
    )
    p.add_argument(
        "--drain",
        type=int,
        default=None,
        help="jobs the worker runs per backlog (default 20000; --quick 2000)",
    )
    p.add_argument(
        "--claims",
        type=int,
        default=None,
        help="timed claim + ack_many pairs, and ack_and_claim calls, per backlog (default 1000; --quick 200)",
    )
    p.add_argument(
        "--finished",
        type=int,
        default=None,
        help="succeeded jobs kept in the retention phase; 0 skips it (default 100000; --quick 10000)",
    )
    p.add_argument(
        "--finished-backlog", type=int, default=1000, help="waiting jobs beside them (default 1000)"
    )
    p.add_argument(
        "--memory-jobs",
        type=int,
        default=None,
        help="jobs of the memory phase; 0 skips it (default 1000000; --quick 50000)",
    )
    p.add_argument(
        "--memory-backlog",
        type=int,
        default=None,
        help="waiting jobs kept during the memory phase (default 50000; --quick 5000)",
    )
    p.add_argument(
        "--memory-interval",
        type=float,
        default=None,
        help="seconds between RSS samples (default 5; --quick 1)",
    )
    p.add_argument("--concurrency", type=int, default=8, help="worker slots (default 8)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: backlogs of 1000 and 10000, 2000 drained, 200 claims, "
        "10000 finished, 50000 memory jobs; writes <date>-scale-quick.*",
    )
    p.add_argument(
        "--pg-url",
        default=DEFAULT_PG,
        help="PostgreSQL for CREATE/DROP DATABASE (default %(default)s)",
    )
    p.add_argument("--redis", default="127.0.0.1:6379", help="host:port (default %(default)s)")
    p.add_argument(
        "--redis-db",
        type=int,
        default=15,
        help="the one Redis database used and FLUSHed, 9-15 (default %(default)s)",
    )
    p.add_argument("--out-dir", type=Path, default=RESULTS_DIR, help="default benchmarks/results")
    p.add_argument(
        "--replot",
        type=Path,
        default=None,
        metavar="JSON",
        help="only write the markdown and chart again from a JSON this script wrote",
    )
    a = p.parse_args(argv)
    a.argv = argv
    a.stores = [s.strip() for s in a.stores.split(",") if s.strip()]
    if not a.stores or set(a.stores) - set(STORES):
        p.error(f"--stores: choose from {','.join(STORES)}")

    def pick(value: Any, full: Any, quick: Any) -> Any:
        return value if value is not None else (quick if a.quick else full)

    a.sizes = pick(a.sizes, [1000, 100_000, 1_000_000], [1000, 10_000])
    a.drain = pick(a.drain, 20_000, 2000)
    a.claims = pick(a.claims, 1000, 200)
    a.finished = pick(a.finished, 100_000, 10_000)
    a.memory_jobs = pick(a.memory_jobs, 1_000_000, 50_000)
    a.memory_backlog = pick(a.memory_backlog, 50_000, 5000)
    a.memory_interval = pick(a.memory_interval, 5.0, 1.0)
    if min([*a.sizes, a.drain, a.claims, a.finished_backlog, a.concurrency, a.memory_backlog]) < 1:
        p.error("sizes and counts must be >= 1")
    if not 9 <= a.redis_db <= 15:
        p.error("--redis-db: one of the databases 9-15")
    if a.finished < 0 or a.memory_jobs < 0 or not a.memory_interval > 0:
        p.error("--finished and --memory-jobs must be >= 0, --memory-interval > 0")
    return a


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = parse(argv)
    if a.replot:
        doc = json.loads(a.replot.read_text())
        write(doc, a.replot.with_suffix(""))
        return 0

    def stop(signum: int, frame: Any) -> None:  # SIGTERM: clean up as for Ctrl-C
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    date = time.strftime("%Y-%m-%d")
    # a run of some stores only, or a smoke run, must not overwrite the full run of the day
    subset = "" if set(a.stores) == set(STORES) else "-" + "-".join(a.stores)
    stem = a.out_dir / (f"{date}-scale{subset}" + ("-quick" if a.quick else ""))
    doc: dict[str, Any] = {
        "benchmark": "scale",
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "command": "python benchmarks/scale.py " + shlex.join(argv),
        "params": {
            k: getattr(a, k)
            for k in (
                "stores",
                "sizes",
                "drain",
                "claims",
                "finished",
                "finished_backlog",
                "memory_jobs",
                "memory_backlog",
                "memory_interval",
                "concurrency",
                "quick",
            )
        }
        | {"claim_limit": CLAIM_LIMIT, "batch": BATCH},
        "machine": machine_info(),
        "stores": [],
    }
    started = time.perf_counter()
    log(
        f"scale run: stores {','.join(a.stores)}; sizes {', '.join(f'{s:,}' for s in a.sizes)}; "
        f"drain {a.drain:,}; claims {a.claims:,}; finished {a.finished:,}; memory {a.memory_jobs:,} jobs"
    )
    failed = []
    for name in a.stores:
        try:
            res = run_store(name, a)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the stores were cleaned up on the way out
            print(
                f"interrupted during {name}; the report has the stores finished before it",
                file=sys.stderr,
            )
            return 130
        except Exception as e:  # one store failing (or Refused) must not lose the others
            if isinstance(e, Refused):
                print(f"{name}: refused: {e}", file=sys.stderr)
            else:
                traceback.print_exc()
            failed.append(name)
            res = {"store": name, "error": repr(e)}
        res["concurrency"] = a.concurrency
        doc["stores"].append(res)
        doc["machine"]["load average at end (1 min)"] = f"{os.getloadavg()[0]:.2f}"
        doc["machine"]["elapsed"] = f"{time.perf_counter() - started:.0f} s"
        write(doc, stem)
    if failed:
        print("FAILED: " + ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
