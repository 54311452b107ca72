"""Redis: Conveyor against Celery, RQ, Dramatiq, Huey, arq and SAQ, each in a database of its own.

Uses ``redis_bench``'s system classes and its phase functions (enqueue, bulk enqueue, drain with
one process, idle latency) as they are, and adds drain with two processes and latency under load.
Every phase runs every system in turn, the order rotating every round. Databases 8-15 of the
Redis are FLUSHed (and only those; ``redis_bench.claim_databases`` refuses foreign keys).
"""

from __future__ import annotations

import argparse
import random
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis_bench as rb
from bench_redis_common import PROBE_KEY
from bench_split_clock import read_split
from sqlite_bench import Proc, wait_until

from harness import raw_writes
from harness.common import (
    Row,
    from_result,
    guarded,
    latency_row,
    load_note,
    na,
    paced,
    rotate,
    running_all,
    say,
)
from harness.cpu import CpuSampler, Server, annotate, measured, redis_server

WAITS = "round trips / locks"  # what a drain that leaves the CPU idle plausibly waits on
SYSTEMS = [
    "conveyor",
    "conveyor-prefetch",
    "celery",
    "rq",
    "dramatiq",
    "huey",
    "arq",
    "saq",
]  # + "arq-default" on request


def drain_count(s: Any, a: argparse.Namespace) -> int:
    return a.slow_jobs if s.name in rb.SLOW else a.jobs


def worker_argv(s: Any, k: int) -> list[str]:
    argv = s.worker_argv()
    if s.name == "celery":  # two workers on one host need distinct node names
        argv += ["-n", f"bench{k}@%h"]
    return argv


def drain_2p(s: Any, a: argparse.Namespace, tmp: Path) -> Row:
    n = drain_count(s, a)
    s.reset()
    if isinstance(s, rb.ConveyorSystem):
        s.ids = []
    if s.has_bulk:
        s.enqueue_bulk(0, n)
    else:
        s.enqueue_n(0, n)
    prefix = str(tmp / f"{s.name}-split-{time.monotonic_ns()}")
    env = {**s.worker_env(), "BENCH_SPLIT_PREFIX": prefix}
    procs = [Proc(f"{s.name}-drain2-{k}", worker_argv(s, k), tmp, env=env) for k in range(2)]
    with running_all(procs):
        wait_until(
            f"{n} {s.name} jobs",
            lambda: read_split(prefix)["count"] >= n,
            max(120.0, n / 40),
            tuple(procs),
        )
        c = read_split(prefix)
        note = f"2 worker processes (jobs per process {c.get('per_process')})"
        if s.name in rb.SLOW:
            note += f"; {n} jobs (slow: --slow-jobs)"
        clock = {
            "first_start": c["first_start"],
            "last_end": c["last_end"],
            "cpu_first": 0.0,
            "cpu_last": c["cpu_s"],
        }
        in_process = {"worker_cpu_ms_per_job_in_process": c["cpu_s"] / n * 1000}
        if isinstance(s, rb.ConveyorSystem):
            r = s.after_drain(n, clock, note)  # window from the store, as for one process
            row = Row(
                s.name, "drain_2p", n, r.jobs_per_s, note=r.note, extra={**r.extra, **in_process}
            )
        else:
            row = Row(
                s.name,
                "drain_2p",
                n,
                n / (c["last_end"] - c["first_start"]),
                note=note + "; wall clock in the workers",
                extra={"window_start": c["first_start"], "window_end": c["last_end"], **in_process},
            )
    s.reset()
    return row


def latency_load(s: Any, a: argparse.Namespace, tmp: Path, rate: float, tag: str) -> Row:
    s.reset()
    proc = Proc(f"{s.name}-load", s.worker_argv(), tmp, env=s.worker_env())
    total = max(1, int(rate * a.load_seconds))
    every = max(1, total // a.load_probes)
    sent: dict[str, float] = {}
    got: dict[str, float] = {}

    def collect(timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(got) < len(sent):
            proc.check_alive()
            item = s.r.blpop([PROBE_KEY], timeout=1)
            if item is not None:
                token, at = item[1].decode().split()
                got[token] = float(at)
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{s.name}: {len(sent) - len(got)} probes did not run within {timeout:g}s"
                )

    def send(i: int) -> None:
        if i % every == 0:
            token = f"{tag}-{i}"
            sent[token] = s.send_probe(token)
        else:
            s.enqueue_n(i, 1)

    with running_all([proc]):
        sent["warm"] = s.send_probe("warm")  # waits for the worker to be up
        collect(90)
        sent.clear()
        got.clear()
        _, achieved = paced(rate, a.load_seconds, send)
        collect(max(120.0, total / 40))
    samples = [(got[t] - sent[t]) * 1000 for t in sent]
    s.reset()
    return latency_row(
        s.name,
        "latency_load",
        samples,
        load_note(rate, achieved) + f"; wall clock, 1 job in {every} is a probe",
    )


def _result_of(scenario: Callable[..., Any], *args: Any) -> Row:
    return from_result(scenario(*args))


# redis_bench's own redis-server figure: INFO cpu from the worker's start, start-up included
OLD_SERVER_CPU = re.compile(r"; redis-server CPU [0-9.]+ ms/job")


def drain(server: Server, s: Any, a: argparse.Namespace, tmp: Path) -> Row:
    """redis_bench's one-process drain, with the CPU figures over its window. Where
    redis-server's CPU was read over the window, that figure replaces redis_bench's (from the
    worker's start), which stays in the row's extra as ``redis_cpu_ms_per_job``."""
    with CpuSampler(server) as cpu:
        row = _result_of(rb.scenario_drain, s, a, tmp)
    if server.root is not None:  # before annotate() adds the figure over the window
        row.note = OLD_SERVER_CPU.sub("", row.note)
    annotate([row], cpu, WAITS)
    return row


def run(
    a: argparse.Namespace, rng: random.Random, systems: list[str]
) -> tuple[list[list[Row]], dict[str, Any]]:
    names = [s for s in rb.SYSTEMS if s in systems]
    rb.claim_databases(a, names)
    env = rb.environment(a)
    objs = {n: rb.SYSTEM_CLASSES[n](a) for n in names}
    server = redis_server(objs[names[0]].r)
    rounds: list[list[Row]] = []
    try:
        for rnd in range(a.rounds):
            order = rotate(names, rnd)
            if "arq-default" in order and "arq" in order:  # they share a database: arq first
                order.remove("arq-default")
                order.insert(order.index("arq") + 1, "arq-default")
            print(f"\n[redis] round {rnd + 1}/{a.rounds}: {', '.join(order)}", flush=True)
            rows: list[Row] = []
            with tempfile.TemporaryDirectory(prefix="conveyor-harness-redis-") as d:
                tmp = Path(d)

                def add(row: Row, rows: list[Row] = rows) -> None:
                    rows.append(row)
                    say(row)

                for n in order:
                    if n != "arq-default":
                        add(guarded(n, "enqueue", _result_of, rb.scenario_enqueue, objs[n], a))
                for n in order:
                    s = objs[n]
                    if n != "arq-default":
                        add(
                            guarded(n, "enqueue_many", _result_of, rb.scenario_bulk, s, a)
                            if s.has_bulk
                            else na(n, "enqueue_many", s.bulk_na)
                        )
                if "conveyor" in order:  # the baseline of Conveyor's bulk target
                    add(raw_writes.redis(a, f"{objs['conveyor'].url}?prefix=raw-{rnd}"))
                for n in order:
                    add(guarded(n, "drain", drain, server, objs[n], a, tmp))
                for n in order:
                    add(guarded(n, "drain_2p", measured, server, WAITS, drain_2p, objs[n], a, tmp))
                for n in order:
                    add(
                        guarded(
                            n,
                            "latency",
                            _result_of,
                            rb.scenario_latency,
                            objs[n],
                            a,
                            tmp,
                            rng,
                            f"r{rnd}",
                        )
                    )
                drains = {
                    r.system: r.jobs_per_s for r in rows if r.scenario == "drain" and r.jobs_per_s
                }
                for n in order:
                    if n not in drains:  # its drain failed: no rate to offer half of
                        continue
                    add(
                        guarded(
                            n,
                            "latency_load",
                            latency_load,
                            objs[n],
                            a,
                            tmp,
                            drains[n] / 2,
                            f"r{rnd}-load",
                        )
                    )
            rounds.append(rows)
    finally:
        for s in objs.values():
            try:
                s.close()
            except Exception as e:
                print(f"  ! closing {s.name}: {e}")
        rb.release_databases(a, names)
    out = {f"redis {k}": v for k, v in env.items() if k.startswith("redis_") and k != "redis"}
    out["redis-py"] = env.get("redis")
    out["hiredis"] = env.get("hiredis")
    out["redis-server CPU measured"] = (
        f"pid {server.root} (from /proc; other clients of this Redis count too)"
        if server.root is not None
        else "no (the server is not a process on this machine): INFO cpu from the worker's start only"
    )
    out["caveats"] = {n: rb.CAVEATS[n] for n in names}
    return rounds, out
