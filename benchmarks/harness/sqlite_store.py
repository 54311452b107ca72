"""SQLite: Conveyor (default ``synchronous=FULL``, and ``synchronous=normal``) against Huey's SqliteHuey.

Phase A is ``sqlite_bench.conveyor_scenarios`` / ``sqlite_bench.huey_scenarios`` as they are
(enqueue, enqueue_many, drain with one process, idle latency); phases B (drain with two
processes) and C (latency under load) are added here. Each phase runs every system in turn,
the order rotating every round. Every round uses fresh database files.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlite_bench as sb
from bench_conveyor_app import make_app
from bench_split_clock import read_split
from sqlite_bench import BATCH, Proc, drain_timeout, sqlite_url, wait_until

from harness import raw_writes
from harness.common import Row, from_result, latency_row, load_note, paced, rotate, running_all, say
from harness.cpu import measured

SYSTEMS = ["conveyor", "conveyor-syncnormal", "huey"]
# What a SQLite drain that leaves the CPU idle plausibly waits on (no server: no round trips)
WAITS = "the write lock / fsync"
QUERY = {"conveyor": "", "conveyor-syncnormal": "synchronous=normal"}


def worker(name: str, url: str, tmp: Path, concurrency: int) -> Proc:
    return Proc(
        name,
        [sys.executable, "-m", "bench_conveyor_worker", url, "--concurrency", str(concurrency)],
        tmp,
    )


def succeeded(db: Path) -> int:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return int(
            conn.execute("SELECT count(*) FROM conveyor_jobs WHERE state = 'succeeded'").fetchone()[
                0
            ]
        )


def conveyor_drain_2p(system: str, tmp: Path, a: argparse.Namespace) -> Row:
    n = a.jobs
    db = tmp / f"{system}-drain2.db"
    url = sqlite_url(db, QUERY[system])
    app, noop = make_app(url)
    app.backend  # noqa: B018
    for start in range(0, n, BATCH):
        noop.enqueue_many([(i,) for i in range(start, min(n, start + BATCH))])
    app.close()
    procs = [worker(f"{system}-drain2-{k}", url, tmp, a.concurrency) for k in range(2)]
    with running_all(procs):
        wait_until(
            f"{n} jobs to succeed", lambda: succeeded(db) >= n, drain_timeout(n), tuple(procs)
        )
    with contextlib.closing(sqlite3.connect(db)) as conn:
        first, last = conn.execute(
            "SELECT min(attempted_at), max(finished_at) FROM conveyor_jobs WHERE state = 'succeeded'"
        ).fetchone()
    return Row(
        system,
        "drain_2p",
        n,
        n / (last - first),
        note=f"2 worker processes x concurrency {a.concurrency}; store clock",
        extra={"window_start": first, "window_end": last},
    )


def conveyor_latency_load(system: str, tmp: Path, a: argparse.Namespace, rate: float) -> Row:
    db = tmp / f"{system}-load.db"
    url = sqlite_url(db, QUERY[system])
    app, noop = make_app(url)
    app.backend  # noqa: B018
    proc = worker(f"{system}-load", url, tmp, a.concurrency)
    with running_all([proc]):
        noop.enqueue(-1)  # warm-up: waits for the worker to be up
        wait_until("the warm-up job", lambda: succeeded(db) >= 1, 60, (proc,))
        total, achieved = paced(rate, a.load_seconds, lambda i: noop.enqueue(i))
        wait_until(
            "the load to finish", lambda: succeeded(db) >= total + 1, drain_timeout(total), (proc,)
        )
    app.close()
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute(
            "SELECT (attempted_at - created_at) * 1000 FROM conveyor_jobs WHERE id > 1"
        ).fetchall()
    return latency_row(
        system,
        "latency_load",
        [r[0] for r in rows],
        load_note(rate, achieved) + "; store clock (1 ms resolution), every job",
    )


def huey_drain_2p(tmp: Path, a: argparse.Namespace) -> Row:
    from bench_huey_app import make_huey

    n = a.jobs
    db = tmp / "huey-drain2.db"
    h, noop, _ = make_huey(str(db))
    for i in range(n):
        noop(i)
    h.storage.close()
    prefix = str(tmp / "huey-split")
    procs = [
        sb.huey_consumer(
            f"huey-drain2-{k}", tmp, db, a.concurrency, [], env={"BENCH_SPLIT_PREFIX": prefix}
        )
        for k in range(2)
    ]
    with running_all(procs):
        wait_until(
            f"{n} Huey jobs",
            lambda: read_split(prefix)["count"] >= n,
            drain_timeout(n),
            tuple(procs),
        )
    c = read_split(prefix)
    return Row(
        "huey",
        "drain_2p",
        n,
        n / (c["last_end"] - c["first_start"]),
        note=f"2 consumers, -w {a.concurrency} -k thread (jobs per process {c['per_process']}); "
        "wall clock in the consumers",
        extra={
            "window_start": c["first_start"],
            "window_end": c["last_end"],
            "worker_cpu_ms_per_job_in_process": c["cpu_s"] / n * 1000,
        },
    )


def huey_latency_load(label: str, tmp: Path, a: argparse.Namespace, rate: float) -> Row:
    from bench_huey_app import make_huey

    db = tmp / f"{label}-load.db"
    h, noop, probe = make_huey(str(db))
    extra = sb.HUEY_TUNED if label == "huey-2ms" else []
    proc = sb.huey_consumer(f"{label}-load", tmp, db, a.concurrency, extra)
    total = max(1, int(rate * a.load_seconds))
    every = max(1, total // a.load_probes)
    probes: list[tuple[float, Any]] = []

    def send(i: int) -> None:
        if i % every == 0:
            sent = time.time()
            probes.append((sent, probe()))
        else:
            noop(i)

    with running_all([proc]):
        probe().get(blocking=True, timeout=60)  # warm-up: waits for the consumer to be up
        _, achieved = paced(rate, a.load_seconds, send)
        samples = [(res.get(blocking=True, timeout=120) - sent) * 1000 for sent, res in probes]
    h.storage.close()
    return latency_row(
        label,
        "latency_load",
        samples,
        load_note(rate, achieved)
        + f"; wall clock, 1 job in {every} is a probe"
        + ("; polling -d 0.002 -m 0.002" if extra else "; Huey's default polling"),
    )


def phase_a(s: str, tmp: Path, a: argparse.Namespace, rng: random.Random) -> list[Row]:
    res = (
        sb.huey_scenarios(tmp, a, rng)
        if s == "huey"
        else sb.conveyor_scenarios(s, tmp, a, rng, QUERY[s])
    )
    return [from_result(r) for r in res]


def run(
    a: argparse.Namespace, rng: random.Random, systems: list[str]
) -> tuple[list[list[Row]], dict[str, Any]]:
    names = [s for s in SYSTEMS if s in systems]
    rounds: list[list[Row]] = []
    for rnd in range(a.rounds):
        order = rotate(names, rnd)
        print(f"\n[sqlite] round {rnd + 1}/{a.rounds}: {', '.join(order)}", flush=True)
        rows: list[Row] = []
        with tempfile.TemporaryDirectory(prefix="conveyor-harness-sqlite-") as d:
            tmp = Path(d)
            for s in order:  # A: the existing scenarios
                got = measured(None, WAITS, phase_a, s, tmp, a, rng)
                rows += got
                for r in got:  # the script printed it before the CPU figures were added
                    if r.scenario == "drain":
                        say(r)
            if "conveyor" in order:  # the baseline of Conveyor's bulk target
                rows.append(raw_writes.sqlite(tmp, a))
                say(rows[-1])
            for s in order:  # B: drain with two processes
                if s == "huey":
                    rows.append(measured(None, WAITS, huey_drain_2p, tmp, a))
                else:
                    rows.append(measured(None, WAITS, conveyor_drain_2p, s, tmp, a))
                say(rows[-1])
            drains = {
                r.system: r.jobs_per_s for r in rows if r.scenario == "drain" and r.jobs_per_s
            }
            for s in order:  # C: latency at half the system's own drain rate
                if s == "huey":
                    for label in ("huey", "huey-2ms"):
                        rows.append(huey_latency_load(label, tmp, a, drains["huey"] / 2))
                        say(rows[-1])
                else:
                    rows.append(conveyor_latency_load(s, tmp, a, drains[s] / 2))
                    say(rows[-1])
        rounds.append(rows)
    env = {
        "sqlite": sqlite3.sqlite_version,
        "durability": "conveyor: synchronous=FULL in WAL (Conveyor's default; an fsync per commit, shared by "
        "concurrent enqueues); conveyor-syncnormal: synchronous=NORMAL; huey: SqliteHuey's default, synchronous=FULL (fsync per commit)",
    }
    return rounds, env
