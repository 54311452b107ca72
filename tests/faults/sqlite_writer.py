"""R5's writer processes: each loops enqueue -> claim -> side effect -> ack on one SQLite file
until the test SIGKILLs it.

``python sqlite_writer.py`` is a zygote: it imports the SQLite backend once, then forks one
writer per JSON line read on stdin and answers with the child's pid. A replacement writer so
costs a fork, not an interpreter start (which would eat this 2-core machine at 10 kills a
second). The zygote opens no database itself, so a child inherits no SQLite state.

Each writer keeps its own history file, written around every enqueue (``invoke`` before the
call, ``ok`` with the job id after it returned), and appends its side effects to the shared log
in the format of faultapp.effect(). Byte ``slot`` of the file ``busy`` is 1 while the writer is
inside a store call, so the test can count the kills that landed in one.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import random
import signal
import sys
import time
import traceback

from conveyor.backends.base import Lease, NewJob
from conveyor.backends.sqlite import SqliteBackend
from conveyor.errors import LeaseLost


def _append(path: str, line: str) -> None:
    """One write() with O_APPEND: what it wrote survives a SIGKILL of this process."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def writer(url: str, log: str, hist: str, errors: str, busy_path: str, slot: int, first_n: int, seed: int,
           lease: float) -> None:
    """Loop until killed: enqueue a job, claim up to 2, record their side effects, ack them."""
    rng = random.Random(seed)
    n = first_n
    with open(busy_path, "r+b") as f:
        busy = mmap.mmap(f.fileno(), 0)
    try:
        backend = SqliteBackend(url)
        while True:
            _append(hist, json.dumps({"type": "invoke", "n": n}) + "\n")
            busy[slot] = 1
            [res] = backend.enqueue_many([NewJob(task="fault.work", queue="default", args=json.dumps({"n": n}),
                                                 max_attempts=100, timeout=60.0)])
            busy[slot] = 0
            _append(hist, json.dumps({"type": "ok", "n": n, "job": res.id}) + "\n")
            n += 1
            busy[slot] = 1
            jobs = backend.claim("default", rng.choice((1, 2)), worker_id=f"writer-{os.getpid()}", lease_s=lease)
            busy[slot] = 0
            for job in jobs:
                now = time.time()
                rec = {"e": "done", "n": job.args["n"], "job": job.id, "attempt": job.attempts,
                       "pid": os.getpid(), "t": now, "t0": now}
                _append(log, json.dumps(rec) + "\n")
                result = json.dumps({"n": job.args["n"], "attempt": job.attempts, "pid": os.getpid()})
                assert job.lease_token is not None
                busy[slot] = 1
                with contextlib.suppress(LeaseLost):  # too slow to keep it: counted as a duplicate
                    backend.ack(Lease(job.id, job.lease_token), result)
                busy[slot] = 0
    except BaseException:
        _append(errors, traceback.format_exc() + "\n---\n")
        raise


def zygote() -> None:
    """Fork a writer for each JSON object of keyword arguments on stdin; print its pid."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps killed writers
    for line in sys.stdin:
        kwargs = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                sys.stdin.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                writer(**kwargs)
            finally:
                os._exit(1)
        sys.stdout.write(f"{pid}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    zygote()
