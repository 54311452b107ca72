"""The traced processes of the power-loss tests: ``python child.py producer|worker URL MARKER SEED``.

``producer`` enqueues ``pl.work(n)`` for n = 0, 1, ... one call at a time; ``worker`` claims
1-3 jobs at a time and acks them (one by one, or in one ``ack_many``). After each call has
*returned*, the process appends one line to the marker file (``E <n> <job id>`` for an enqueue,
``A <job id>`` for a completion), then prints the same line on stdout, a pipe to the test. Both
run under the LD_PRELOAD shim until the test SIGKILLs them (the power cut). The marker file is
in the traced directory, so its writes take their place in the shim's log: a marker before a
cut point is an acknowledgement the caller had received before the power failed there.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

from conveyor import Conveyor, ConveyorError
from conveyor.backends.base import Lease

LEASE_S = 1.0
QUEUE = "default"


def work(n: int) -> int:
    return n


def make_app(url: str) -> Conveyor:
    """The app both sides use (the test's drain too): one task, ``pl.work``."""
    app = Conveyor(url)
    app.task(name="pl.work", max_attempts=100, timeout=60)(work)
    return app


def main(role: str, url: str, marker: str, seed: int) -> None:
    rng = random.Random(seed)
    app = make_app(url)
    deadline = time.monotonic() + 20
    while True:  # a server started beside this process may not listen yet
        try:
            app.backend.now()
            break
        except ConveyorError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    fd = os.open(marker, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def acked(line: str) -> None:
        os.write(fd, (line + "\n").encode())
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    if role == "producer":
        task = app.tasks["pl.work"]
        n = 0
        while True:
            job = task.enqueue(n)
            acked(f"E {n} {job.id}")
            n += 1
            time.sleep(rng.uniform(0, 0.002))
    backend = app.backend
    worker_id = f"pl-worker-{os.getpid()}"
    while True:
        jobs = backend.claim(QUEUE, rng.randint(1, 3), worker_id=worker_id, lease_s=LEASE_S)
        if not jobs:
            backend.wait_for_jobs([QUEUE], 0.05)
            continue
        leases = [(Lease(j.id, j.lease_token), json.dumps(j.args["n"])) for j in jobs if j.lease_token]
        if rng.random() < 0.5:
            for lease, result in leases:
                backend.ack(lease, result)
                acked(f"A {lease.job_id}")
        else:
            for (lease, _), ok in zip(leases, backend.ack_many(leases), strict=True):
                if ok:
                    acked(f"A {lease.job_id}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
