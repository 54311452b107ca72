"""The app that the process tests' workers load: ``conveyor --app procapp:app worker ...``.

``app = Conveyor()`` takes its store from ``$CONVEYOR_URL``. Every task appends one JSON line
``{"job", "attempt", "pid", "event"}`` to a marker file (``O_APPEND``, one ``write`` call, then
``fsync``), so a test can see from outside which process ran which attempt of which job.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from conveyor import Conveyor, Reject, RetryPolicy
from conveyor.executor import current_job

# Short backoff so retries after a timeout or an exception come back quickly.
app = Conveyor(retry=RetryPolicy(base=0.2, factor=2.0, cap=1.0))


def mark(marker: str, event: str = "start", *, sync: bool = True) -> dict[str, Any]:
    """Append one line about the running job to ``marker``; return what was written."""
    ctx = current_job()
    assert ctx is not None, "mark() must run inside a task"
    rec = {"job": ctx.id, "attempt": ctx.attempt, "pid": os.getpid(), "event": event}
    fd = os.open(marker, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(rec) + "\n").encode())
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return rec


def _sleep(seconds: float, gate: str | None) -> None:
    """Sleep ``seconds``, or less if the file ``gate`` appears."""
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or (gate is not None and os.path.exists(gate)):
            return
        time.sleep(min(left, 0.05) if gate is not None else left)


@app.task(name="record", max_attempts=5, timeout=120)
def record(marker: str, sleep: float = 0.0, fast_from_attempt: int = 0, gate: str | None = None,
           sync: bool = True) -> dict[str, Any]:
    """Mark "start", sleep ``sleep`` s (not at all from attempt ``fast_from_attempt`` on, or less
    once ``gate`` exists), then mark "end" if it was to sleep. Returns the attempt and the pid."""
    rec = mark(marker, sync=sync)
    if not (fast_from_attempt and rec["attempt"] >= fast_from_attempt):
        _sleep(sleep, gate)
    if sleep:
        mark(marker, "end", sync=sync)
    return {"attempt": rec["attempt"], "pid": rec["pid"]}


@app.task(name="hang", max_attempts=2, timeout=0.5)
def hang(marker: str, seconds: float = 10.0) -> str:
    """A sync task that overruns its 0.5 s timeout."""
    mark(marker)
    time.sleep(seconds)
    mark(marker, "finished")
    return "should have timed out"


@app.task(name="ahang", max_attempts=2, timeout=0.5)
async def ahang(marker: str, seconds: float = 10.0) -> str:
    """An async task that overruns its 0.5 s timeout; records that it was cancelled."""
    mark(marker)
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        mark(marker, "cancelled")
        raise
    mark(marker, "finished")
    return "should have timed out"


@app.task(name="crash", max_attempts=3, timeout=30)
def crash(marker: str) -> None:
    """Kills the worker process that runs it, every time."""
    mark(marker)
    os._exit(1)


@app.task(name="reject", max_attempts=5, timeout=30)
def reject(reason: str) -> None:
    """Goes straight to the dead-letter queue."""
    raise Reject(reason)
