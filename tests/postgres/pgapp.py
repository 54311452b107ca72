"""The app the PostgreSQL process tests' workers load: ``conveyor --app pgapp:app worker ...``.

``app = Conveyor()`` takes its store from ``$CONVEYOR_URL`` (a fresh schema, or a private
server). Every task appends one JSON line ``{"job", "attempt", "pid"}`` to a marker file with
one ``O_APPEND`` ``write`` call, so a test counts, from outside, how many times each job ran
and in which process. The marker lives outside the database on purpose: it records a run
even when the run's own database writes were lost with a killed connection.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from conveyor import Conveyor, RetryPolicy
from conveyor.executor import current_job

# Short backoff, so an attempt that failed on a lost connection comes back quickly.
app = Conveyor(retry=RetryPolicy(base=0.2, factor=2.0, cap=1.0))


def mark(marker: str, *, sync: bool = False) -> dict[str, Any]:
    """Append one line about the running attempt to ``marker``; return what was written."""
    ctx = current_job()
    assert ctx is not None, "mark() must run inside a task"
    rec = {"job": ctx.id, "attempt": ctx.attempt, "pid": os.getpid()}
    fd = os.open(marker, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(rec) + "\n").encode())
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return rec


@app.task(name="pg.record", max_attempts=10, timeout=120)
def record(marker: str, sleep: float = 0.0, fast_from_attempt: int = 0) -> dict[str, Any]:
    """Mark the run, then sleep ``sleep`` s (not at all from attempt ``fast_from_attempt`` on)."""
    rec = mark(marker, sync=sleep > 0)
    if sleep and not (fast_from_attempt and rec["attempt"] >= fast_from_attempt):
        time.sleep(sleep)
    return {"attempt": rec["attempt"], "pid": rec["pid"]}
