"""How long each dashboard page takes on a big store. Not a test (timings are never assertions):

    .venv/bin/python tests/dashboard/bench_dashboard.py --fill-sqlite /tmp/big.db 1000000
    .venv/bin/python tests/dashboard/bench_dashboard.py --url sqlite:////tmp/big.db
    .venv/bin/python tests/dashboard/bench_dashboard.py --url 'postgresql://...'

``--fill-sqlite`` writes N jobs straight into a fresh SQLite store with one INSERT per row
(claiming and acking a million jobs through the API would take far longer): 95 % succeeded,
2 % dead, the rest waiting, over 4 queues and 20 tasks. Each page is fetched through the real
app (TestClient) ``--repeat`` times and the median is printed.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import statistics
import time

from starlette.testclient import TestClient

from conveyor import Conveyor
from conveyor.backends import open_backend
from conveyor.dashboard import create_app
from conveyor.job import JobState


def fill_sqlite(path: str, n: int) -> None:
    open_backend(f"sqlite:///{path}").close()  # creates the schema
    rng = random.Random(1)
    now = time.time()
    tasks = [f"app.tasks.t{i}" for i in range(20)]
    queues = ["high", "default", "low", "emails"]
    error = json.dumps([{"attempt": 1, "at": now, "kind": "exception", "type": "ValueError", "message": "boom",
                         "traceback": "Traceback (most recent call last): ...", "worker_id": "w1"}])

    def rows():  # type: ignore[no-untyped-def]
        for i in range(n):
            r = rng.random()
            state = "succeeded" if r < 0.95 else "dead" if r < 0.97 else "available" if r < 0.995 else "scheduled"
            finished = now - 1000 + i / 1000 if state in ("succeeded", "dead") else None
            yield (rng.choice(queues), rng.choice(tasks), json.dumps({"user_id": i, "note": f"n{i}"}), state,
                   now - 2000 + i / 1000 if state != "scheduled" else now + 3600, 0 if state == "available" else 1,
                   3, 30.0, error if state == "dead" else "[]", now - 2000 + i / 1000, finished)

    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT INTO conveyor_jobs (queue, task, args, state, run_at, attempt, max_attempts, timeout_s, errors,"
            " created_at, finished_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url")
    parser.add_argument("--fill-sqlite", nargs=2, metavar=("PATH", "N"))
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if args.fill_sqlite:
        started = time.perf_counter()
        fill_sqlite(args.fill_sqlite[0], int(args.fill_sqlite[1]))
        print(f"filled {args.fill_sqlite[1]} jobs in {time.perf_counter() - started:.1f}s")
        return
    app = Conveyor(args.url)
    b = app.backend
    newest = b.list_jobs(limit=1).jobs[0].id
    dead = b.list_jobs(state=JobState.DEAD, limit=1).jobs[0].id
    middle = newest // 2
    pages = [
        "/", "/jobs", f"/jobs?cursor={middle}", "/jobs?state=dead", f"/jobs?state=dead&cursor={middle}",
        "/jobs?state=succeeded", "/jobs?state=available", "/jobs?queue=emails", "/jobs?task=app.tasks.t3",
        "/jobs?queue=emails&state=dead", f"/jobs?q={middle}", "/jobs?q=n999999", "/jobs?q=no-such-text",
        "/dead", f"/jobs/{dead}", "/queues/emails", "/workers", "/cron",
    ]
    dash = create_app(app, sample_interval=3600)
    with TestClient(dash, base_url="http://127.0.0.1:8000", client=("127.0.0.1", 1)) as client:
        print(f"{sum(q.succeeded + q.dead + q.available + q.scheduled for q in b.stats().queues):,} jobs in "
              f"{args.url.split('?')[0]}")
        for path in pages:
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                r = client.get(path)
                times.append(time.perf_counter() - t0)
                assert r.status_code == 200, (path, r.status_code)
            print(f"  {path:42s} {statistics.median(times) * 1000:8.1f} ms")
    dash.close()
    app.close()


if __name__ == "__main__":
    main()
