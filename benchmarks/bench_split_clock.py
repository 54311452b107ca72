"""A drain clock for a backlog shared by several worker processes (the harness's ``drain_2p``).

Each worker process counts the no-op bodies it ran and keeps the wall-clock time of its first
body start and last body end (and its CPU time at both). A daemon thread writes that state,
when it changed, every 50 ms to ``<prefix>.<pid>.json``. The driver sums the counts of all
files until they reach the backlog, then takes the earliest start and the latest end:
:func:`read_split`. Nothing is written per job, so the clock costs the workers next to nothing.

Enabled in a worker process by ``$BENCH_SPLIT_PREFIX`` (see ``bench_redis_common`` and
``bench_huey_app``).
"""

from __future__ import annotations

import glob
import json
import os
import threading
import time
from typing import Any

DUMP_EVERY_S = 0.05


class SplitClock:
    def __init__(self, prefix: str) -> None:
        self.path = f"{prefix}.{os.getpid()}.json"
        self.lock = threading.Lock()
        self.first_start: float | None = None
        self.cpu_first: float | None = None
        self.last_end: float | None = None
        self.count = 0
        self._dumped = -1
        threading.Thread(target=self._dump_loop, name="split-clock", daemon=True).start()

    def start(self) -> None:
        if self.first_start is None:
            now, cpu = time.time(), time.process_time()
            with self.lock:
                if self.first_start is None:
                    self.first_start, self.cpu_first = now, cpu

    def end(self) -> None:
        now = time.time()
        with self.lock:
            self.count += 1
            if self.last_end is None or now > self.last_end:
                self.last_end = now

    def _dump_loop(self) -> None:
        while True:
            time.sleep(DUMP_EVERY_S)
            with self.lock:
                if self.count == self._dumped:
                    continue
                doc = {
                    "first_start": self.first_start,
                    "last_end": self.last_end,
                    "cpu_first": self.cpu_first,
                    "cpu_last": time.process_time(),
                    "count": self.count,
                }
                self._dumped = self.count
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(doc, f)
            os.replace(tmp, self.path)


def read_split(prefix: str) -> dict[str, Any]:
    """The clocks of every process under ``prefix`` combined: count, first start, last end, CPU."""
    docs = []
    for path in glob.glob(f"{glob.escape(prefix)}.*.json"):
        try:
            with open(path) as f:
                docs.append(json.load(f))
        except (OSError, ValueError):
            continue
    docs = [d for d in docs if d.get("count")]
    if not docs:
        return {"count": 0, "processes": 0}
    return {
        "count": sum(d["count"] for d in docs),
        "first_start": min(d["first_start"] for d in docs),
        "last_end": max(d["last_end"] for d in docs),
        "cpu_s": sum(d["cpu_last"] - d["cpu_first"] for d in docs),
        "processes": len(docs),
        "per_process": [d["count"] for d in docs],
    }


def from_env() -> SplitClock | None:
    prefix = os.environ.get("BENCH_SPLIT_PREFIX")
    return SplitClock(prefix) if prefix else None
