"""The Huey app of the peer benchmark (``--peers``): the same no-op task on SqliteHuey.

The producer calls ``make_huey(path)``. The consumer loads ``bench_huey_app.huey``, which
exists when ``$BENCH_HUEY_DB`` names the database file. Huey stores no start/finish times,
so when ``$BENCH_HUEY_EXPECT`` (a job count) and ``$BENCH_HUEY_DONE`` (a file path) are also
set, the consumer records (with Huey signals, in its own process) the wall-clock time the
first ``noop`` started and the last one completed, and writes them as JSON to
``$BENCH_HUEY_DONE`` once that many ``noop`` jobs have completed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from huey import SqliteHuey
from huey.signals import SIGNAL_COMPLETE, SIGNAL_EXECUTING

NOOP = "bench.noop"
PROBE = "bench.probe"


def make_huey(filename: str) -> tuple[SqliteHuey, Any, Any]:
    """A SqliteHuey on ``filename`` (Huey's defaults otherwise) with the benchmark's tasks."""
    h = SqliteHuey("bench", filename=filename)

    @h.task(name=NOOP)
    def noop(i: int = 0) -> None:
        return None

    @h.task(name=PROBE)
    def probe() -> float:
        """The latency probe: returns the wall-clock time it started (stored as its result)."""
        return time.time()

    return h, noop, probe


class _DrainClock:
    """Counts completed ``noop`` jobs in the consumer; writes the times once all are done."""

    def __init__(self, expect: int, path: str) -> None:
        self.expect = expect
        self.path = path
        self.lock = threading.Lock()
        self.first_start: float | None = None
        self.last_complete: float | None = None
        self.completed = 0
        self.written = False

    def started(self, signal: str, task: Any, *args: Any, **kwargs: Any) -> None:
        if task.name != NOOP:
            return
        now = time.time()
        with self.lock:
            if self.first_start is None or now < self.first_start:
                self.first_start = now

    def completed_one(self, signal: str, task: Any, *args: Any, **kwargs: Any) -> None:
        if task.name != NOOP:
            return
        now = time.time()
        with self.lock:
            self.completed += 1
            self.last_complete = now if self.last_complete is None else max(now, self.last_complete)
            if self.completed >= self.expect and not self.written:
                self.written = True
                tmp = self.path + ".tmp"
                with open(tmp, "w") as f:
                    json.dump(
                        {
                            "first_start": self.first_start,
                            "last_complete": self.last_complete,
                            "completed": self.completed,
                        },
                        f,
                    )
                os.replace(tmp, self.path)


_db = os.environ.get("BENCH_HUEY_DB")
if _db:
    huey, noop, probe = make_huey(_db)
    _expect = int(os.environ.get("BENCH_HUEY_EXPECT", "0"))
    _done = os.environ.get("BENCH_HUEY_DONE")
    if _expect > 0 and _done:
        _clock = _DrainClock(_expect, _done)
        huey.signal(SIGNAL_EXECUTING)(_clock.started)
        huey.signal(SIGNAL_COMPLETE)(_clock.completed_one)
    elif os.environ.get("BENCH_SPLIT_PREFIX"):  # several consumers share the backlog
        from bench_split_clock import from_env

        _split = from_env()
        assert _split is not None

        def _split_start(signal: str, task: Any, *args: Any, **kwargs: Any) -> None:
            if task.name == NOOP:
                _split.start()

        def _split_end(signal: str, task: Any, *args: Any, **kwargs: Any) -> None:
            if task.name == NOOP:
                _split.end()

        huey.signal(SIGNAL_EXECUTING)(_split_start)
        huey.signal(SIGNAL_COMPLETE)(_split_end)
