"""SQS: Conveyor against Celery (kombu's SQS transport), on a moto server started for the run.

moto is a Python server (one process): on one machine with two cores it, not the job systems,
sets most of the pace, and it is not AWS (no network round trip of tens of milliseconds, no
distributed queue, exact counts). What this measures is each system's requests against the same
local SQS API, and what they cost moto; every row's note gives moto's CPU per job.

The scenarios are the RabbitMQ driver's functions (``harness/rabbitmq_store``), on the systems of
``harness/sqs_systems``, each system in turn, the order rotating every round:

1. ``enqueue``: N jobs, one producer call each, after one untimed warm-up call.
2. ``enqueue_many``: N jobs, 1000 per call (Conveyor's ``enqueue_many``); n/a for Celery.
   Beside them, ``raw-writes``: Conveyor's message body sent with boto3 alone, one SendMessage
   at a time, and in SendMessageBatch calls of 10.
3. ``drain``: the backlog run by one worker process with 8 slots, timed by the worker's own
   clock (first body start to last body end); the queue must then be empty.
4. ``drain_2p``: the same with two worker processes.
5. ``latency``: a fresh, idle worker; probes one at a time, 5-20 ms apart, each waited for;
   wall clock from just before the enqueue call to the first line of the probe body.
6. ``latency_load``: one worker, fed at half the drain rate that system reached this round.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import tempfile
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from harness import rabbitmq_store
from harness.common import Row, guarded, rotate, say
from harness.rabbitmq_store import (
    bulk,
    drain_2p,
    enqueue,
    latency,
    latency_load,
)
from harness.rabbitmq_systems import ProbeListener, cpu_seconds
from harness.sqs_systems import (
    CAVEATS,
    SYSTEM_CLASSES,
    Admin,
    ConveyorSystem,
    RawSend,
    System,
    aws_dummy_env,
    moto_server,
    moto_version,
)

SYSTEMS = ["conveyor", "celery", "celery-poll50ms"]
RAW = "raw-writes"


def with_server_cpu(pid: int, phase: Callable[[], Row]) -> Row:
    """``phase()``, with moto's CPU per job over it added to its note."""
    cpu0 = cpu_seconds(pid)
    row = phase()
    cpu1 = cpu_seconds(pid)
    if cpu0 is not None and cpu1 is not None and row.jobs and not row.na:
        ms = (cpu1 - cpu0) / row.jobs * 1000
        row.extra["server_cpu_ms_per_job"] = ms
        row.note += f"; moto CPU {ms:.3f} ms/job"
    return row


def raw_rows(
    a: argparse.Namespace, admin: Admin, endpoint: str, conv: ConveyorSystem, pid: int
) -> list[Row]:
    raw = RawSend(admin, endpoint, conv)
    try:
        one = with_server_cpu(
            pid,
            lambda: Row(
                RAW,
                "enqueue",
                a.jobs,
                a.jobs / raw.one_by_one(a.jobs),
                note="boto3 SendMessage, one at a time",
            ),
        )
        many = with_server_cpu(
            pid,
            lambda: Row(
                RAW,
                "enqueue_many",
                a.jobs,
                a.jobs / raw.batched(a.jobs),
                note="boto3 SendMessageBatch of 10, one call at a time",
            ),
        )
    finally:
        raw.close()
    return [one, many]


def drain(s: System, a: argparse.Namespace, tmp: Path, pid: int) -> Row:
    # Celery with kombu's default polling runs about 8 jobs a second here: a longer wait.
    return rabbitmq_store.drain(
        s, a, tmp, pid, "moto", "server_cpu_ms_per_job", lambda n: max(300.0, n / 2)
    )


def run(
    a: argparse.Namespace, rng: random.Random, systems: list[str]
) -> tuple[list[list[Row]], dict[str, Any]]:
    names = [n for n in SYSTEM_CLASSES if n in systems]
    tag = uuid.uuid4().hex[:6]
    rounds: list[list[Row]] = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(aws_dummy_env())
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="conveyor-moto-")))
        endpoint, pid = stack.enter_context(moto_server(logs))
        print(f"\n[sqs] moto server on {endpoint} (pid {pid})", flush=True)
        admin = Admin(endpoint)
        stack.callback(admin.close)
        probes = ProbeListener()
        stack.callback(probes.close)
        objs: dict[str, System] = {}
        for n in names:
            objs[n] = SYSTEM_CLASSES[n](a, admin, endpoint, tag, probes.addr)
            stack.callback(objs[n].close)
        for rnd in range(a.rounds):
            order = rotate(names, rnd)
            print(f"\n[sqs] round {rnd + 1}/{a.rounds}: {', '.join(order)}", flush=True)
            rows: list[Row] = []
            with tempfile.TemporaryDirectory(prefix="conveyor-harness-sqs-") as d:
                tmp = Path(d)

                def add(row: Row, rows: list[Row] = rows) -> None:
                    rows.append(row)
                    say(row)

                for n in order:
                    add(guarded(n, "enqueue", with_server_cpu, pid, partial(enqueue, objs[n], a)))
                conveyor = objs.get("conveyor")
                if isinstance(conveyor, ConveyorSystem):  # the baselines of its enqueues
                    for row in raw_rows(a, admin, endpoint, conveyor, pid):
                        add(row)
                for n in order:
                    add(guarded(n, "enqueue_many", with_server_cpu, pid, partial(bulk, objs[n], a)))
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
    env: dict[str, Any] = {
        "sqs server": moto_version() + ", started for this run on a loopback port, "
        "dummy credentials; not AWS",
        "queue prefix": f"bsqs{tag}_<system> (on moto, gone with it at the end)",
        "caveats": {n: CAVEATS[n] for n in [*names, RAW] if n in CAVEATS},
    }
    return rounds, env
