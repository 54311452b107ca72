"""What a Redis bulk enqueue costs per job, on the library of several git revisions in turn:
the script's server time (INFO commandstats, EVALSHA usec), the redis-server's CPU (INFO cpu),
the client's CPU (time.process_time) and the wall rate.

    .venv/bin/python benchmarks/redis_enqueue_cost.py --redis 127.0.0.1:6391 \\
        --refs 63051b1,main,. [--jobs 40000] [--rounds 6]

The call is redis_bench.py's ``enqueue_many`` scenario: ``bench.noop`` jobs, 1,000 per
``enqueue_many``. On a shared machine wall rates swing with the neighbours' load; the CPU
figures per job move much less, so they are what a change is judged by. Each revision's
``src/`` is exported with ``git archive`` (``.`` is this checkout) and put first on PYTHONPATH
of a child process; rounds alternate the revisions and flip their order every round.

Use a redis-server of your own (``redis-server --port 6391 --save "" --appendonly no``): every
run resets its command statistics (CONFIG RESETSTAT). Each run writes under a prefix of its own
and deletes its keys afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BATCH = 1000
FIGURES = (("rate", "jobs/s", ",.0f"), ("client_us", "client CPU us/job", ".2f"),
           ("redis_cpu_us", "redis-server CPU us/job", ".2f"),
           ("script_us", "script usec/job", ".2f"))


def measure(redis_at: str, n: int) -> dict[str, float]:
    """One run on the library this process imports (the child's side)."""
    import redis

    from conveyor import Conveyor

    host, port = redis_at.rsplit(":", 1)
    r = redis.Redis(host=host, port=int(port))
    prefix = f"enqcost-{uuid.uuid4().hex[:8]}"
    app = Conveyor(f"redis://{redis_at}/0?prefix={prefix}")

    @app.task(name="bench.noop")
    def noop(i: int = 0) -> None:
        pass

    def server_cpu() -> float:
        info: dict[str, Any] = r.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    try:
        noop.enqueue_many([(i,) for i in range(BATCH)])  # warm: connections, scripts loaded
        r.config_resetstat()
        cpu0, proc0, t0 = server_cpu(), time.process_time(), time.perf_counter()
        for start in range(0, n, BATCH):
            noop.enqueue_many([(i,) for i in range(start, min(n, start + BATCH))])
        wall, proc, cpu = (time.perf_counter() - t0, time.process_time() - proc0,
                           server_cpu() - cpu0)
        stats: dict[str, Any] = r.info("commandstats")
        script = stats.get("cmdstat_evalsha", {}).get("usec", 0)
    finally:
        app.close()
        keys = list(r.scan_iter(match=f"{{{prefix}}}*", count=1000))
        for at in range(0, len(keys), 500):
            r.delete(*keys[at:at + 500])
        r.close()
    return {"rate": n / wall, "client_us": proc / n * 1e6, "redis_cpu_us": cpu / n * 1e6,
            "script_us": script / n}


def export(ref: str, into: Path) -> Path:
    """The ``src/`` of ``ref`` (``.``: this checkout's, as it is on disk)."""
    if ref == ".":
        return ROOT / "src"
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "src"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis", required=True, help="host:port of a redis-server of your own")
    parser.add_argument("--refs", default=".",
                        help="git revisions, comma-separated ('.' = this checkout); the first is "
                        "the base of the ratios")
    parser.add_argument("--jobs", type=int, default=40000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.redis, args.jobs)))
        return 0
    refs = [r for r in args.refs.split(",") if r]
    seen: dict[str, list[dict[str, float]]] = {ref: [] for ref in refs}
    with tempfile.TemporaryDirectory(prefix="enqcost-") as tmp:
        trees = {ref: export(ref, Path(tmp) / str(k)) for k, ref in enumerate(refs)}
        for rnd in range(args.rounds):
            for ref in refs if rnd % 2 == 0 else refs[::-1]:
                env = {**os.environ, "PYTHONPATH": str(trees[ref])}
                out = subprocess.run(
                    [sys.executable, __file__, "--child", "--redis", args.redis,
                     "--jobs", str(args.jobs)],
                    check=True, env=env, capture_output=True, text=True).stdout
                seen[ref].append(json.loads(out.strip().splitlines()[-1]))
                last = seen[ref][-1]
                print(f"round {rnd + 1} {ref:>12}: " + ", ".join(
                    f"{label} {last[key]:{fmt}}" for key, label, fmt in FIGURES), flush=True)
    print(f"\nmedians of {args.rounds} rounds, {args.jobs:,} jobs in calls of {BATCH:,}:")
    base = refs[0]
    for ref in refs:
        cells = []
        for key, label, fmt in FIGURES:
            mid = statistics.median(r[key] for r in seen[ref])
            ratio = mid / statistics.median(r[key] for r in seen[base])
            cells.append(f"{label} {mid:{fmt}} (x{ratio:.2f})")
        print(f"{ref:>12}: " + ", ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
