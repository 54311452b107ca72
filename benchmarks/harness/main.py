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


def main(a: argparse.Namespace) -> int:
    from harness import postgres_store, redis_store, sqlite_store

    drivers = {"sqlite": sqlite_store, "postgres": postgres_store, "redis": redis_store}
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
        try:
            rounds, store_env = driver.run(a, rng, systems)
        except Exception as e:  # one store failing must not lose the others
            import traceback

            traceback.print_exc()
            failed.append(f"{store}: {e!r}")
            continue
        env.update(store_env)
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
