"""Idle wake-up latency on Redis: how long after its enqueue an idle worker claims a job.

Not a test (pytest does not collect it): ``.venv/bin/python tests/redis/measure_latency.py``.
It starts a private redis-server (AOF, appendfsync everysec) and a real worker process with
the default 1 s poll interval, then enqueues one job at a time, each after the worker has gone
idle again. Latency is ``attempted_at - created_at``: both are stamped by Redis's clock, so the
number is free of clock differences between processes.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from redisrig import RedisServer, Worker, wait_until

from conveyor.backends import open_backend
from conveyor.backends.base import NewJob
from conveyor.job import JobState


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=500, help="jobs to time")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="conveyor-latency-"))
    server = RedisServer(tmp).start()
    worker = Worker(tmp, server.url, "--queues", "default", "--concurrency", "4", name="latency")
    producer = open_backend(server.url)
    try:
        worker.wait_started()
        lat: list[float] = []
        for i in range(args.n + 20):
            time.sleep(random.uniform(0.01, 0.03))  # the worker is back in its blocking wait
            [res] = producer.enqueue_many(
                [NewJob(task="echo", queue="default", args=f'{{"n": {i}}}', max_attempts=3, timeout=10)]
            )

            def done(job_id: int = res.id) -> object:
                j = producer.get(job_id)
                return j if j is not None and j.state is JobState.SUCCEEDED else None

            job = wait_until(done, 10, f"job {res.id}", interval=0.0005)
            assert job.attempted_at is not None
            if i >= 20:  # warm-up: imports, script loading, connections
                lat.append((job.attempted_at - job.created_at) * 1000)
        lat.sort()
        p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]  # noqa: E731
        print(f"enqueue -> claim by an idle worker, {len(lat)} jobs (store clock, ms): "
              f"p50 {statistics.median(lat):.2f}  p90 {p(0.90):.2f}  p99 {p(0.99):.2f}  max {lat[-1]:.2f}")
        return 0
    finally:
        worker.stop()
        producer.close()
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
