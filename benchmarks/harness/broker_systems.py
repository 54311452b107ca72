"""What the message-broker drivers' systems share: the interface the scenarios of
``harness/rabbitmq_store`` call (``System``), on RabbitMQ (``harness/rabbitmq_systems``) and SQS
(``harness/sqs_systems``) alike, and Conveyor's producer calls, the same on both."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from sqlite_bench import BATCH


class System:
    """One job system under its own prefix: producer calls, queues, worker command. ``admin``
    is the driver's own client for counts and purges (``count``, ``purge``)."""

    name: str
    has_bulk = False
    bulk_na = ""

    def __init__(
        self, a: argparse.Namespace, admin: Any, prefix: str, env: dict[str, str]
    ) -> None:
        self.a = a
        self.admin = admin
        self.prefix = prefix
        self.env = env
        os.environ.update(self.env)  # the peers' modules read them at import, here too

    # names
    def queues(self) -> list[str]:
        raise NotImplementedError

    def job_queues(self) -> list[str]:
        """The queues a job waits in (their messages are the backlog)."""
        return self.queues()[:1]

    # producer
    def enqueue_n(self, start: int, n: int) -> None:
        raise NotImplementedError

    def enqueue_bulk(self, start: int, n: int) -> None:
        raise NotImplementedError

    def send_probe(self, token: str) -> float:
        """Enqueue probe ``token``; returns the wall-clock time just before the call."""
        raise NotImplementedError

    def warm(self) -> None:
        """Open the producer's connection or client (declaring or making its queues) outside
        the timing."""

    def backlog(self) -> int:
        return sum(self.admin.count(q) or 0 for q in self.job_queues())

    # worker
    def worker_argv(self, k: int = 0) -> list[str]:
        raise NotImplementedError

    def worker_env(self) -> dict[str, str]:
        return dict(self.env)

    # housekeeping
    def reset(self) -> None:
        for q in self.queues():
            self.admin.purge(q)

    def close(self) -> None:
        pass


class ConveyorCalls:
    """Conveyor's producer calls (a System's), on the ``noop`` and ``probe`` tasks of the
    driver's ``bench_*_conveyor.make_app``."""

    noop: Any
    probe: Any

    def enqueue_n(self, start: int, n: int) -> None:
        enqueue = self.noop.enqueue
        for i in range(start, start + n):
            enqueue(i)

    def enqueue_bulk(self, start: int, n: int) -> None:
        for s in range(start, start + n, BATCH):
            self.noop.enqueue_many([(i,) for i in range(s, min(start + n, s + BATCH))])

    def send_probe(self, token: str) -> float:
        sent = time.time()
        self.probe.enqueue(token)
        return sent
