"""One app on one shard against one app over three (``partitions=``), on a local Redis Cluster
of three masters (no replicas) started here on loopback: bulk enqueue, then a drain by worker
processes, with each master's CPU per job (``INFO cpu``) beside the wall rate.

    python benchmarks/cluster_shards.py [--jobs 30000] [--workers 3] [--rounds 2]

The one-shard app is a plain app (all its keys under one hash tag, one master); the sharded one
is ``partitions=3`` with a prefix whose three partitions land on three different masters. Both
drain the same three queues (one per partition on the sharded app). On a machine with fewer
cores than masters plus workers the wall rate is bound by the machine, not by Redis: read the
Redis CPU per job and how it spreads over the masters (the busiest master's share is what
bounds one app on a real cluster).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "redis"))
sys.path.insert(0, str(HERE))

from bench_conveyor_app import make_app  # noqa: E402
from clusterrig import LocalCluster  # noqa: E402

from conveyor.backends.redis.partitions import queue_partition  # noqa: E402


def master_cpu(cluster: LocalCluster) -> dict[str, float]:
    out = {}
    for node in cluster.nodes:
        info = node.info("cpu")
        out[node.addr] = float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    return out


def spread_prefix(cluster: LocalCluster, partitions: int) -> str:
    """A prefix whose partitions are served by as many masters as there are (up to N)."""
    masters = len({cluster.owner(s).addr for s in range(0, 16384, 4096)})
    while True:
        prefix = f"bench_{uuid.uuid4().hex[:8]}"
        owners = {cluster.owner(cluster.slot_of(f"{prefix}#{p}")).addr for p in range(partitions)}
        if len(owners) == min(masters, partitions):
            return prefix


def queues_for(partitions: int) -> list[str]:
    """Three queue names, one per partition when there are three."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < 3:
        p = queue_partition(f"q{i}", partitions) if partitions > 1 else i
        found.setdefault(p, f"q{i}")
        i += 1
    return list(found.values())


def one_round(cluster: LocalCluster, shards: int, jobs: int, workers: int) -> dict[str, Any]:
    prefix = spread_prefix(cluster, shards) if shards > 1 else f"bench_{uuid.uuid4().hex[:8]}"
    url = cluster.url(prefix, query=f"&partitions={shards}" if shards > 1 else "")
    queues = queues_for(shards)
    app, noop = make_app(url)
    per = jobs // len(queues)
    cpu0 = master_cpu(cluster)
    t0 = time.perf_counter()
    for q in queues:
        call = noop.options(queue=q)
        for start in range(0, per, 1000):
            call.enqueue_many([(i,) for i in range(start, min(per, start + 1000))])
    enqueue_s = time.perf_counter() - t0
    cpu1 = master_cpu(cluster)
    env = {**os.environ, "PYTHONPATH": f"{HERE}:{os.environ.get('PYTHONPATH', '')}"}
    procs = [subprocess.Popen([sys.executable, "-m", "bench_conveyor_worker", url,
                               "--queues", ",".join(queues)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(workers)]
    t1 = time.perf_counter()
    total = per * len(queues)
    try:
        while True:
            done = sum(s.succeeded for s in app.backend.stats(finished=True).queues)
            if done >= total:
                break
            if time.perf_counter() - t1 > 600:
                raise RuntimeError(f"drain stalled at {done} of {total}")
            time.sleep(0.05)
        drain_s = time.perf_counter() - t1
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
    cpu2 = master_cpu(cluster)
    app.close()
    for p in range(shards):
        cluster.delete_prefix(f"{prefix}#{p}" if shards > 1 else prefix)
    drain_cpu = {k: cpu2[k] - cpu1[k] for k in cpu2}
    return {
        "shards": shards, "jobs": total,
        "enqueue_rate": total / enqueue_s, "drain_rate": total / drain_s,
        "enqueue_redis_ms": 1000 * sum(cpu1[k] - cpu0[k] for k in cpu1) / total,
        "drain_redis_ms": 1000 * sum(drain_cpu.values()) / total,
        "drain_busiest_ms": 1000 * max(drain_cpu.values()) / total,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=30_000)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(Path(tmp), masters=3, replicas=0).start()
        try:
            print(f"{a.jobs} jobs, {a.workers} worker processes (concurrency 8), "
                  f"{os.cpu_count()} CPUs; Redis CPU ms per job: all masters / the busiest")
            print("| round | shards | enqueue jobs/s | drain jobs/s | enqueue Redis ms/job "
                  "| drain Redis ms/job | drain busiest master ms/job |")
            print("|---|---:|---:|---:|---:|---:|---:|")
            for r in range(a.rounds):
                for shards in (1, 3):
                    m = one_round(cluster, shards, a.jobs, a.workers)
                    print(f"| {r + 1} | {shards} | {m['enqueue_rate']:,.0f} | "
                          f"{m['drain_rate']:,.0f} | {m['enqueue_redis_ms']:.3f} | "
                          f"{m['drain_redis_ms']:.3f} | {m['drain_busiest_ms']:.3f} |",
                          flush=True)
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
