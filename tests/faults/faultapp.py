"""The app the fault tests' worker processes load: ``conveyor --app faultapp:app worker ...``.

``app = Conveyor()`` takes its store from ``$CONVEYOR_URL``. Every execution of a test task
appends one JSON line to the side-effect log ``$FAULT_LOG`` (``O_APPEND``, one ``write``, then
``fsync``) *before* it returns: ``{"e": "done", "n", "job", "attempt", "pid", "t0", "t"}``. The
log outlives a SIGKILL of the worker, so the checker (harness.py) counts from outside how many
times each job's side effect happened, in which attempt and process.

``$FAULT_CRON`` (a cron expression, seconds as the 6th field) adds the schedule ``fault.cron``
that enqueues ``fault.tick``; only the cron tests set it.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from typing import Any

from conveyor import Conveyor, Reject, RetryPolicy, faultpoints
from conveyor.executor import current_job

# Retries come back quickly; crash-looping jobs are bounded by max_attempts, not by time.
app = Conveyor(retry=RetryPolicy(base=0.05, factor=2.0, cap=0.5))

LOG = os.environ.get("FAULT_LOG")
SYNC = os.environ.get("FAULT_LOG_SYNC", "1") == "1"


def effect(event: str, n: int, **extra: Any) -> dict[str, Any]:
    """Append one record about the running attempt to the side-effect log; return it."""
    ctx = current_job()
    assert ctx is not None, "effect() runs inside a task"
    rec = {"e": event, "n": n, "job": ctx.id, "attempt": ctx.attempt, "pid": os.getpid(), "t": time.time(),
           **extra}
    if LOG:
        fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(rec) + "\n").encode())
            if SYNC:
                os.fsync(fd)
        finally:
            os.close(fd)
    return rec


def _sleep(seconds: float) -> bool:
    """Sleep; False (early) if the worker says this attempt must stop (its lease was lost)."""
    ctx = current_job()
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if ctx is not None and ctx.cancelled:
            return False
        time.sleep(min(left, 0.05))
    return True


_barriers: dict[int, threading.Barrier] = {}
_barriers_lock = threading.Lock()


def _meet(parties: int) -> None:
    """Wait (up to 10 s) until ``parties`` attempts in this process got here."""
    with _barriers_lock:
        barrier = _barriers.setdefault(parties, threading.Barrier(parties, timeout=10))
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait()


@app.task(name="fault.work", max_attempts=100, timeout=60)
def work(n: int, sleep: float = 0.0, together: int = 0, pad: str = "") -> dict[str, Any]:
    """The chaos job: sleep, then record its side effect. Never fails by itself. An attempt
    told to stop (its lease was lost) returns without the side effect, as a careful task would.

    ``together=K`` (kill-point tests, only in a worker with ``CONVEYOR_FAULTPOINT`` set): the
    attempt returns only once K attempts in this process have recorded their side effect, so
    a kill point after the handler finds all K done. ``pad`` only makes the job bigger."""
    t0 = time.time()
    if sleep and not _sleep(sleep):
        return {"n": n, "abandoned": True}
    rec = effect("done", n, t0=t0)
    if together and os.environ.get("CONVEYOR_FAULTPOINT"):
        _meet(together)
    faultpoints.hit("in_handler")  # the side effect happened, the task has not returned
    return {"n": n, "attempt": rec["attempt"], "pid": rec["pid"]}


@app.task(name="fault.callback", max_attempts=100, timeout=60)
def callback(tag: str) -> dict[str, Any]:
    """A workflow's callback (a batch's on_success/on_complete): records that it ran."""
    rec = effect("callback", 0, tag=tag, t0=time.time())
    faultpoints.hit("in_handler")
    return {"tag": tag, "attempt": rec["attempt"]}


# -- poison jobs (R6) ---------------------------------------------------------------------------
@app.task(name="fault.crash", max_attempts=3, timeout=30)
def crash(n: int) -> None:
    """Takes the worker process down on every attempt."""
    effect("crash", n)
    os._exit(1)


@app.task(name="fault.reject", max_attempts=5, timeout=30)
def reject(n: int) -> None:
    """Permanent failure: straight to the dead-letter queue."""
    effect("reject", n)
    raise Reject(f"poison {n}")


@app.task(name="fault.huge_error", max_attempts=5, timeout=30)
def huge_error(n: int, size: int = 1_000_000) -> None:
    """Raises an exception whose message is ``size`` characters long."""
    effect("huge", n)
    raise RuntimeError("x" * size)


# -- cron (R10) -----------------------------------------------------------------------------
@app.task(name="fault.tick", max_attempts=5, timeout=30)
def tick() -> None:
    """One cron tick's job: records the tick it was meant for."""
    ctx = current_job()
    assert ctx is not None and ctx.cron_tick is not None
    effect("tick", 0, tick=ctx.cron_tick.timestamp())


if os.environ.get("FAULT_CRON"):
    app.schedule("fault.tick", os.environ["FAULT_CRON"], name="fault.cron")
