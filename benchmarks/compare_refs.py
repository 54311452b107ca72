"""Conveyor against an earlier Conveyor: the same benchmark scripts, run in turns on the library
of two git revisions, reported as new/old ratios.

    .venv/bin/python benchmarks/compare_refs.py --old 644a6db [--new REV] [--stores postgres,redis]
        [--jobs 10000] [--rounds 3]

The scripts (postgres_bench.py, redis_bench.py, sqlite_bench.py) are this checkout's; only the
library changes: the old revision is checked out into a temporary git worktree and put first on
PYTHONPATH (the worker subprocesses inherit it). Rounds alternate old/new and the order flips
every round, so a drift of the machine falls on both. Refactors use it to show that nothing got
slower (issue 37: the Redis and PostgreSQL drains of the old and the new code, in one run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCRIPTS = {"postgres": "postgres_bench.py", "redis": "redis_bench.py", "sqlite": "sqlite_bench.py"}
SCENARIOS = ("enqueue_many", "drain")
# Besides jobs/s: the drain's worker CPU per job (less noisy on a shared machine), as a
# pseudo-scenario whose ratio reads the same way (new/old above 1 is better).
CPU = "drain_cpu"


def run_once(store: str, src: Path, jobs: int, out: Path) -> dict[str, float]:
    """One run of the store's script on the library in ``src``: jobs/s by scenario."""
    cmd = [sys.executable, str(HERE / SCRIPTS[store]), "--jobs", str(jobs), "--rounds", "1",
           "--latency-samples", "20", "--output", str(out)]
    if store != "sqlite":
        cmd += ["--systems", "conveyor"]
    env = {**os.environ, "PYTHONPATH": str(src)}
    subprocess.run(cmd, check=True, env=env, cwd=HERE, stdout=subprocess.DEVNULL)
    doc = json.loads(out.read_text())
    rates: dict[str, float] = {}
    for r in doc["results"]:
        if r.get("system") == "conveyor" and r["scenario"] in SCENARIOS and r.get("jobs_per_s"):
            rates[r["scenario"]] = float(r["jobs_per_s"])
            if r["scenario"] == "drain" and r.get("cpu_ms_per_job"):
                rates[CPU] = 1000.0 / float(r["cpu_ms_per_job"])  # jobs per worker CPU second
    return rates


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, help="git revision of the earlier library")
    parser.add_argument("--new", default=None,
                        help="git revision of the later library (default: this checkout)")
    parser.add_argument("--stores", default="postgres,redis")
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    stores = [s for s in args.stores.split(",") if s]
    with tempfile.TemporaryDirectory(prefix="conveyor-old-") as tmp:
        made = []
        trees = {"old": ROOT / "src", "new": ROOT / "src"}
        for label in ("old", "new"):
            ref = getattr(args, label)
            if ref is not None:
                made.append(Path(tmp) / label)
                subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q",
                                str(made[-1]), ref], check=True)
                trees[label] = made[-1] / "src"
        try:
            seen: dict[tuple[str, str, str], list[float]] = {}
            for k in range(args.rounds):
                order = ["old", "new"] if k % 2 == 0 else ["new", "old"]
                for store in stores:
                    for label in order:
                        rates = run_once(store, trees[label], args.jobs, Path(tmp) / "out.json")
                        for scenario, rate in rates.items():
                            seen.setdefault((store, scenario, label), []).append(rate)
                        print(f"round {k + 1} {store:<8} {label}: "
                              + ", ".join(f"{s} {r:,.0f}/s" for s, r in rates.items()), flush=True)
        finally:
            for tree in made:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                str(tree)], check=False)
    print(f"\nmedians over {args.rounds} rounds, {args.jobs} jobs, old = {args.old}, "
          f"new = {args.new or 'this checkout'}")
    print(f"{'store':<9} {'scenario':<13} {'old jobs/s':>11} {'new jobs/s':>11} {'new/old':>8}")
    for store in stores:
        for scenario in (*SCENARIOS, CPU):
            old = seen.get((store, scenario, "old"))
            new = seen.get((store, scenario, "new"))
            if old and new:
                o, n = statistics.median(old), statistics.median(new)
                print(f"{store:<9} {scenario:<13} {o:>11,.0f} {n:>11,.0f} {n / o:>8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
