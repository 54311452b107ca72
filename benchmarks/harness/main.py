"""Run the stores' drivers in the peer environment and write the reports (called by run.py)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shlex
import subprocess
import sys
import threading
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from harness.common import Row, summarize
from harness.report import charts, markdown

PACKAGES = (
    "conveyor",
    "redis",
    "hiredis",
    "psycopg",
    "celery",
    "kombu",
    "rq",
    "dramatiq",
    "huey",
    "arq",
    "procrastinate",
    "saq",
    "taskiq",
    "taskiq-aio-pika",
    "aio-pika",
    "amqp",
    "pika",
    "boto3",
    "botocore",
    "pycurl",
    "moto",
    "matplotlib",
)


def machine() -> dict[str, Any]:
    env: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load average at start (1 min)": f"{os.getloadavg()[0]:.2f}",
    }
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parents[2],
            timeout=5,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parents[2],
            timeout=5,
        ).stdout.strip()
        env["conveyor commit"] = rev + (" (with uncommitted changes under src/)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    versions = []
    for pkg in PACKAGES:
        try:
            versions.append(f"{pkg} {version(pkg)}")
        except PackageNotFoundError:
            versions.append(f"{pkg} (not installed)")
    env["packages"] = ", ".join(versions)
    try:
        fs = subprocess.run(
            ["df", "-T", "/tmp"], capture_output=True, text=True, timeout=5
        ).stdout.splitlines()[-1]
        env["/tmp filesystem (SQLite files)"] = fs.split()[1]
    except (OSError, subprocess.SubprocessError, IndexError):
        pass
    return env


class HostSteal:
    """The share of CPU time the hypervisor took from this VM while a store's run went on
    (``steal`` in /proc/stat), sampled every second: a run on a contended host says so in its
    own report, instead of the reader guessing from slow peers."""

    def __init__(self) -> None:
        self.shares: list[float] = []  # per interval
        self.first = self.last = self._read()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-steal", daemon=True)

    @staticmethod
    def _read() -> tuple[int, int] | None:
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        # user nice system idle iowait irq softirq steal (guest time is inside user already)
        return (fields[7], sum(fields[:8])) if len(fields) >= 8 else None

    @staticmethod
    def _share(a: tuple[int, int] | None, b: tuple[int, int] | None) -> float | None:
        if a is None or b is None or b[1] <= a[1]:
            return None
        return (b[0] - a[0]) / (b[1] - a[1])

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            now = self._read()
            share = self._share(self.last, now)
            if share is not None:
                self.shares.append(share)
            self.last = now

    def start(self) -> HostSteal:
        self._thread.start()
        return self

    def stop(self) -> dict[str, str]:
        self._stop.set()
        self._thread.join(5)
        total = self._share(self.first, self._read())
        if total is None:
            return {"host steal": "not measured (no /proc/stat steal field)"}
        busy = sum(1 for x in self.shares if x >= 0.05)
        return {
            "host steal (hypervisor)": f"{100 * total:.2f} % of CPU time over the run; "
            f"worst second {100 * max(self.shares, default=0.0):.1f} %; "
            f"{busy} of {len(self.shares)} seconds at 5 % or more"
        }


def main(a: argparse.Namespace) -> int:
    from harness import common, postgres_store, rabbitmq_store, redis_store, sqlite_store, sqs_store

    common.PRODUCER_NICE = getattr(a, "producer_nice", 0)

    drivers = {
        "sqlite": sqlite_store,
        "postgres": postgres_store,
        "redis": redis_store,
        "rabbitmq": rabbitmq_store,
        "sqs": sqs_store,
    }
    rng = random.Random(a.seed)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    date = time.strftime("%Y-%m-%d")
    command = "python benchmarks/run.py " + shlex.join(a.argv)
    failed = []
    for store in a.stores:
        driver = drivers[store]
        systems = a.systems or [*driver.SYSTEMS]
        started = time.perf_counter()
        env = machine()
        steal = HostSteal().start()
        try:
            rounds, store_env = driver.run(a, rng, systems)
        except Exception as e:  # one store failing must not lose the others
            import traceback

            traceback.print_exc()
            failed.append(f"{store}: {e!r}")
            continue
        finally:
            steal_env = steal.stop()
        env.update(store_env)
        env.update(steal_env)
        env["load average at end (1 min)"] = f"{os.getloadavg()[0]:.2f}"
        env["elapsed"] = f"{time.perf_counter() - started:.0f} s"
        env["date"] = time.strftime("%Y-%m-%d %H:%M %Z")
        summary: list[Row] = summarize(rounds)
        # a smoke run must not overwrite the real run of the same day
        stem = f"{date}-{store}" + ("-quick" if a.quick else "")
        paths = charts(store, summary, a.out_dir, stem)
        params = {
            "command": command,
            "mode": "quick run (--quick)" if a.quick else "run",
            "jobs": a.jobs,
            "rounds": a.rounds,
            "latency_samples": a.latency_samples,
            "load_seconds": a.load_seconds,
            "concurrency": a.concurrency,
            "slow_jobs": a.slow_jobs,
        }
        md = a.out_dir / f"{stem}.md"
        md.write_text(markdown(store, summary, rounds, env, params, paths))
        (a.out_dir / f"{stem}.json").write_text(
            json.dumps(
                {
                    "params": params,
                    "environment": env,
                    "summary": [r.public() for r in summary],
                    "rounds": [[r.public() for r in rs] for rs in rounds],
                },
                indent=1,
                default=str,
            )
            + "\n"
        )
        print(f"\n[{store}] wrote {md} and {', '.join(p.name for p in paths)}\n")
        print(
            "\n".join(md.read_text().split("## Notes per result")[0].splitlines()[4:]), flush=True
        )
    if failed:
        print("FAILED: " + "; ".join(failed), file=sys.stderr)
        return 1
    return 0
