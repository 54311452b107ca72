"""PostgreSQL: Conveyor against procrastinate, each in a fresh database per phase.

Phase A is ``postgres_bench.scenarios`` as it is (enqueue, enqueue_many, drain with one process,
idle latency); phases B (drain with two processes) and C (latency under load) are added here
and use the same ``postgres_bench.System`` classes (their SQL reads each system's own tables
and the database's clock). Each phase runs every system in turn, the order rotating every round.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import postgres_bench as pb
import psycopg
from sqlite_bench import BATCH, Proc, drain_timeout, wait_until

from harness import raw_writes
from harness.common import Row, from_result, latency_row, load_note, paced, rotate, running_all, say
from harness.cpu import Server, measured, postgres_server

SYSTEMS = ["conveyor", "procrastinate"]
CLASSES: dict[str, Any] = {"conveyor": pb.ConveyorSystem, "procrastinate": pb.ProcrastinateSystem}
WAITS = "round trips / locks / commits"  # what a drain that leaves the CPU idle plausibly waits on


@contextlib.contextmanager
def system(a: argparse.Namespace, name: str) -> Iterator[Any]:
    with pb.fresh_database(a.pg_url, name) as url:
        s = CLASSES[name](url, a.concurrency)
        try:
            yield s
        finally:
            s.close()


def drain_2p(s: Any, tmp: Path, a: argparse.Namespace) -> Row:
    n = a.jobs
    for start in range(0, n, BATCH):
        s.enqueue_batch(list(range(start, min(n, start + BATCH))))
    s.db.execute(b"ANALYZE")
    procs = [Proc(f"{s.name}-drain2-{k}", s.worker_argv(), tmp) for k in range(2)]
    with running_all(procs):
        wait_until(
            f"{n} {s.name} jobs",
            lambda: not s.one(s.unfinished_sql),
            drain_timeout(n),
            tuple(procs),
        )
        done, first, last, reruns = s.db.execute(s.window_sql.encode()).fetchone()
    assert done == n, (s.name, done, n)
    note = f"2 worker processes x concurrency {a.concurrency}; database clock"
    if reruns:
        note += f"; {reruns} jobs ran more than once"
    return Row(
        s.name,
        "drain_2p",
        n,
        n / (last - first),
        note=note,
        extra={"window_start": first, "window_end": last},
    )


def latency_load(s: Any, tmp: Path, a: argparse.Namespace, rate: float) -> Row:
    proc = Proc(f"{s.name}-load", s.worker_argv(), tmp)
    ids: list[int] = []
    with running_all([proc]):
        warm = s.enqueue(-1)  # waits for the worker to be up
        wait_until(
            "the warm-up job", lambda: s.one(s.finished_sql, [warm]) is not None, 60, (proc,)
        )
        _, achieved = paced(rate, a.load_seconds, lambda i: ids.append(s.enqueue(i)))
        wait_until(
            "the load to finish",
            lambda: not s.one(s.unfinished_sql),
            drain_timeout(len(ids)),
            (proc,),
        )
    samples = [r[0] * 1000 for r in s.db.execute(s.latency_sql.encode(), [ids]).fetchall()]
    return latency_row(
        s.name, "latency_load", samples, load_note(rate, achieved) + "; database clock, every job"
    )


def server(a: argparse.Namespace) -> Server | None:
    """The PostgreSQL server's processes, if it runs on this machine."""
    try:
        with psycopg.connect(a.pg_url, connect_timeout=5) as conn:
            return postgres_server(conn)
    except Exception:
        return None


def phase_a(s: Any, tmp: Path, a: argparse.Namespace, rng: random.Random) -> list[Row]:
    return [from_result(r) for r in pb.scenarios(s, tmp, a, rng)]


def run(
    a: argparse.Namespace, rng: random.Random, systems: list[str]
) -> tuple[list[list[Row]], dict[str, Any]]:
    names = [s for s in SYSTEMS if s in systems]
    pg = server(a)
    rounds: list[list[Row]] = []
    for rnd in range(a.rounds):
        order = rotate(names, rnd)
        print(f"\n[postgres] round {rnd + 1}/{a.rounds}: {', '.join(order)}", flush=True)
        rows: list[Row] = []
        with tempfile.TemporaryDirectory(prefix="conveyor-harness-pg-") as d:
            tmp = Path(d)
            for name in order:  # A: the existing scenarios
                with system(a, name) as s:
                    got = measured(pg, WAITS, phase_a, s, tmp, a, rng)
                    rows += got
                    for r in got:  # the script printed it before the CPU figures were added
                        if r.scenario == "drain":
                            say(r)
            if "conveyor" in order:  # the baseline of Conveyor's bulk target
                rows.append(raw_writes.postgres(a))
                say(rows[-1])
            for name in order:  # B
                with system(a, name) as s:
                    rows.append(measured(pg, WAITS, drain_2p, s, tmp, a))
                    say(rows[-1])
            drains = {
                r.system: r.jobs_per_s for r in rows if r.scenario == "drain" and r.jobs_per_s
            }
            for name in order:  # C
                with system(a, name) as s:
                    rows.append(latency_load(s, tmp, a, drains[name] / 2))
                    say(rows[-1])
        rounds.append(rows)
    env: dict[str, Any] = {}
    with contextlib.suppress(Exception), psycopg.connect(a.pg_url, connect_timeout=5) as conn:
        for setting in (
            "server_version",
            "fsync",
            "synchronous_commit",
            "wal_sync_method",
            "shared_buffers",
        ):
            env[f"postgresql {setting}"] = conn.execute(f"SHOW {setting}").fetchone()[0]  # type: ignore[index]
    env["postgresql CPU measured"] = (
        f"postmaster pid {pg.root} and its children (from /proc)"
        if pg is not None and pg.root is not None
        else "no (the server is not a process on this machine, or /proc is not readable)"
    )
    return rounds, env
