"""RabbitMQ: Conveyor against Celery, Dramatiq and Taskiq, each under a queue prefix of its own.

The same six scenarios as the other stores, each system in turn, the order rotating every
round (``harness/rabbitmq_systems.py`` has the systems; ``bench_rabbitmq_*`` the worker sides):

1. ``enqueue``: N jobs, one producer call each, after one untimed warm-up call; the queue
   must then hold N + 1 messages.
2. ``enqueue_many``: N jobs, 1000 per call, where the system has a batch API (Conveyor's
   ``enqueue_many``); n/a for the peers. Beside it, ``raw-writes``: Conveyor's message body
   published with no job system, one confirm at a time (pika) and 1000 confirms in flight
   (aio-pika).
3. ``drain``: the backlog run by one worker process with 8 slots. None of the four keeps a
   start or finish time the driver could read back (a broker keeps no job record), so for all
   of them the window is the worker process's own clock: first no-op body start to last body
   end (``bench_redis_common.DrainClock``). After the worker stopped (SIGTERM: each finishes
   and acks what it holds), the queue must be empty; the note says so or counts what was left.
   The note also gives the worker's CPU per job and the RabbitMQ server's (its whole process,
   other clients included).
4. ``drain_2p``: the same with two worker processes (``bench_split_clock``).
5. ``latency``: a fresh, idle worker; probes one at a time, 5-20 ms apart, each waited for;
   wall clock from just before the enqueue call to the first line of the probe body, which
   reports by UDP (``bench_rabbitmq_common``).
6. ``latency_load``: one worker, fed on a fixed schedule at half the drain rate that system
   reached this round, 1 job in k a probe.

Nothing outside the prefixes is touched; every queue and exchange made is deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_split_clock import read_split
from sqlite_bench import GAP_S, Proc, running, wait_until

from harness.broker_systems import System
from harness.common import (
    Row,
    guarded,
    latency_row,
    load_note,
    na,
    paced,
    rotate,
    running_all,
    say,
)
from harness.rabbitmq_systems import (
    CAVEATS,
    SYSTEM_CLASSES,
    Admin,
    ConveyorSystem,
    ProbeListener,
    RawPublish,
    broker_pid,
    cpu_seconds,
)

SYSTEMS = ["conveyor", "celery", "dramatiq", "taskiq"]  # + "conveyor-prefetch" on request
RAW = "raw-writes"


def timeout_for(n: int) -> float:
    return max(120.0, n / 20)


def enqueue(s: System, a: argparse.Namespace) -> Row:
    n = a.jobs
    s.reset()
    s.enqueue_n(0, 1)  # warm-up: connection, declarations, imports; it stays in the queue
    t0 = time.perf_counter()
    s.enqueue_n(1, n)
    dt = time.perf_counter() - t0
    got = s.backlog()
    assert got == n + 1, f"{s.name}: {got} messages queued, expected {n + 1}"
    return Row(s.name, "enqueue", n, n / dt, note="one call per job, each confirmed")


def bulk(s: System, a: argparse.Namespace) -> Row:
    if not s.has_bulk:
        return na(s.name, "enqueue_many", s.bulk_na)
    n = a.jobs
    s.reset()
    s.warm()
    t0 = time.perf_counter()
    s.enqueue_bulk(0, n)
    dt = time.perf_counter() - t0
    got = s.backlog()
    assert got == n, f"{s.name}: {got} messages queued, expected {n}"
    return Row(s.name, "enqueue_many", n, n / dt, note="batches of 1000")


def raw_rows(a: argparse.Namespace, admin: Admin, conveyor: ConveyorSystem) -> list[Row]:
    raw = RawPublish(a, admin, conveyor)
    one = raw.one_by_one(a.jobs)
    many = raw.batched(a.jobs)
    return [
        Row(
            RAW,
            "enqueue",
            a.jobs,
            a.jobs / one,
            note="pika blocking channel, one publish and its confirm at a time",
        ),
        Row(
            RAW,
            "enqueue_many",
            a.jobs,
            a.jobs / many,
            note="aio-pika, 1000 publishes with their confirms in flight together",
        ),
    ]


def left_note(s: System) -> str:
    left = s.backlog()
    if left:
        return f"; {left} messages left in the queue after the worker stopped"
    return "; queue empty after the worker stopped (every message acked)"


def drain(
    s: System,
    a: argparse.Namespace,
    tmp: Path,
    pid: int | None,
    server: str = "RabbitMQ server",
    cpu_key: str = "broker_cpu_ms_per_job",
    timeout: Callable[[int], float] = timeout_for,
) -> Row:
    """``server`` names the process ``pid`` in the note, ``cpu_key`` its CPU per job in the
    row's extra; ``timeout(n)``: how long ``n`` jobs may take."""
    n = s.backlog()  # the bulk enqueue's, or the one-by-one enqueue's (N + 1)
    done = tmp / f"{s.name}-drain.json"
    done.unlink(missing_ok=True)
    env = {**s.worker_env(), "BENCH_EXPECT": str(n), "BENCH_DONE": str(done)}
    cpu0 = cpu_seconds(pid)
    with running(Proc(f"{s.name}-drain", s.worker_argv(), tmp, env=env)) as worker:
        wait_until(f"{n} {s.name} jobs to run", done.exists, timeout(n), (worker,))
        cpu1 = cpu_seconds(pid)
    clock = json.loads(done.read_text())
    window = clock["last_end"] - clock["first_start"]
    worker_ms = (clock["cpu_last"] - clock["cpu_first"]) / n * 1000
    note = f"wall clock in the worker; worker CPU {worker_ms:.3f} ms/job"
    extra: dict[str, Any] = {"worker_cpu_ms_per_job": worker_ms}
    if cpu0 is not None and cpu1 is not None:
        # From the worker's start to the last body: the server's share of the whole drain.
        extra[cpu_key] = (cpu1 - cpu0) / n * 1000
        note += f"; {server} CPU {extra[cpu_key]:.3f} ms/job"
    note += left_note(s)
    s.reset()
    return Row(s.name, "drain", n, n / window, note=note, extra=extra)


def drain_2p(s: System, a: argparse.Namespace, tmp: Path) -> Row:
    n = a.jobs
    s.reset()
    if s.has_bulk:
        s.enqueue_bulk(0, n)
    else:
        s.enqueue_n(0, n)
    prefix = str(tmp / f"{s.name}-split-{time.monotonic_ns()}")
    env = {**s.worker_env(), "BENCH_SPLIT_PREFIX": prefix}
    procs = [Proc(f"{s.name}-drain2-{k}", s.worker_argv(k), tmp, env=env) for k in range(2)]
    with running_all(procs):
        wait_until(
            f"{n} {s.name} jobs",
            lambda: read_split(prefix)["count"] >= n,
            timeout_for(n),
            tuple(procs),
        )
        c = read_split(prefix)
    note = (
        f"2 worker processes (jobs per process {c.get('per_process')}); wall clock in the workers"
    )
    note += left_note(s)
    s.reset()
    return Row(s.name, "drain_2p", n, n / (c["last_end"] - c["first_start"]), note=note)


def latency(
    s: System, a: argparse.Namespace, tmp: Path, rng: random.Random, tag: str, probes: ProbeListener
) -> Row:
    s.reset()
    probes.clear()
    out: list[float] = []
    with running(Proc(f"{s.name}-latency", s.worker_argv(), tmp, env=s.worker_env())) as worker:

        def one(token: str, timeout: float) -> float:
            sent = s.send_probe(token)
            return probes.wait({token}, timeout, (worker,))[token] - sent

        one(f"{tag}-warmup", 90)  # waits for the worker to be up
        time.sleep(0.3)
        for i in range(a.latency_samples):
            time.sleep(rng.uniform(*GAP_S))
            out.append(one(f"{tag}-{i}", 30) * 1000)
    s.reset()
    return latency_row(s.name, "latency", out, "wall clock, enqueue call to probe body start")


def latency_load(
    s: System, a: argparse.Namespace, tmp: Path, rate: float, tag: str, probes: ProbeListener
) -> Row:
    s.reset()
    probes.clear()
    total = max(1, int(rate * a.load_seconds))
    every = max(1, total // a.load_probes)
    sent: dict[str, float] = {}

    def send(i: int) -> None:
        if i % every == 0:
            token = f"{tag}-{i}"
            sent[token] = s.send_probe(token)
        else:
            s.enqueue_n(i, 1)

    with running(Proc(f"{s.name}-load", s.worker_argv(), tmp, env=s.worker_env())) as worker:
        s.send_probe(f"{tag}-warm")  # waits for the worker to be up
        probes.wait({f"{tag}-warm"}, 90, (worker,))
        _, achieved = paced(rate, a.load_seconds, send)
        got = probes.wait(set(sent), timeout_for(total), (worker,))
    s.reset()
    samples = [(got[t] - sent[t]) * 1000 for t in sent]
    return latency_row(
        s.name,
        "latency_load",
        samples,
        load_note(rate, achieved) + f"; wall clock, 1 job in {every} is a probe",
    )


def run(
    a: argparse.Namespace, rng: random.Random, systems: list[str]
) -> tuple[list[list[Row]], dict[str, Any]]:
    names = [n for n in SYSTEM_CLASSES if n in systems]
    tag = uuid.uuid4().hex[:6]
    admin = Admin(a.amqp)
    probes = ProbeListener()
    pid = broker_pid(a.amqp)
    objs: dict[str, System] = {}
    rounds: list[list[Row]] = []
    try:
        for n in names:
            objs[n] = SYSTEM_CLASSES[n](a, admin, tag, probes.addr)
        for rnd in range(a.rounds):
            order = rotate(names, rnd)
            print(f"\n[rabbitmq] round {rnd + 1}/{a.rounds}: {', '.join(order)}", flush=True)
            rows: list[Row] = []
            with tempfile.TemporaryDirectory(prefix="conveyor-harness-rabbitmq-") as d:
                tmp = Path(d)

                def add(row: Row, rows: list[Row] = rows) -> None:
                    rows.append(row)
                    say(row)

                for n in order:
                    add(guarded(n, "enqueue", enqueue, objs[n], a))
                conveyor = objs.get("conveyor")
                if isinstance(conveyor, ConveyorSystem):  # the baselines of its enqueues
                    for row in raw_rows(a, admin, conveyor):
                        add(row)
                for n in order:
                    add(guarded(n, "enqueue_many", bulk, objs[n], a))
                for n in order:
                    add(guarded(n, "drain", drain, objs[n], a, tmp, pid))
                for n in order:
                    add(guarded(n, "drain_2p", drain_2p, objs[n], a, tmp))
                for n in order:
                    add(guarded(n, "latency", latency, objs[n], a, tmp, rng, f"r{rnd}", probes))
                drains = {
                    r.system: r.jobs_per_s for r in rows if r.scenario == "drain" and r.jobs_per_s
                }
                for n in order:
                    if n not in drains:  # its drain failed: no rate to offer half of
                        continue
                    add(guarded(n, "latency_load", latency_load,
                                objs[n], a, tmp, drains[n] / 2, f"r{rnd}-load", probes))
            rounds.append(rows)
    finally:
        for s in objs.values():
            try:
                s.close()
            except Exception as e:
                print(f"  ! closing {s.name}: {e}")
        probes.close()
        admin.close()
    env: dict[str, Any] = {
        "rabbitmq": _server_version(a.amqp),
        "rabbitmq server pid (CPU measured)": pid if pid is not None else "not found",
        "queue prefix": f"benchrmq-{tag}-<system> (deleted at the end)",
        "caveats": {n: CAVEATS[n] for n in [*names, RAW] if n in CAVEATS},
    }
    return rounds, env


def _server_version(url: str) -> str:
    import pika

    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
    except Exception as e:
        return f"unknown ({e!r})"
    try:
        props = conn._impl.server_properties  # what the server said when the connection opened
        return f"{props.get('version')} ({props.get('platform')})"
    finally:
        conn.close()
