"""Load on a cluster app while an operator moves its slot or fails its node over: a producer
thread enqueueing one job at a time, and a worker thread draining them, each with an app (so a
backend, so a route to the slot) of its own. Every execution is counted by the job's number,
so a lost job (acknowledged, never run) and a duplicate (run more than once) are both seen.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

from clusterrig import wait_until
from support import WorkerThread

from conveyor import Conveyor, RetryPolicy, StoreUnavailable
from conveyor.backends.redis import RedisBackend

TASK = "cluster.record"
QUEUE = "default"  # the task's, the only one the worker takes from


class Load:
    """``queues``: the producers enqueue to them in turn and the worker takes from all (a
    partitioned app's queues, in partitions on different masters)."""

    def __init__(self, worker_url: str, *producer_urls: str, concurrency: int = 4,
                 lease: float = 5.0, queues: tuple[str, ...] = (QUEUE,)) -> None:
        self.runs: collections.Counter[int] = collections.Counter()
        self._lock = threading.Lock()
        self.queues = queues
        self.worker_app = self._app(worker_url)
        self.producers = [Producer(self._app(url), k, queues)
                          for k, url in enumerate(producer_urls)]
        self.worker = WorkerThread(self.worker_app, queues=list(queues),
                                   concurrency=concurrency, poll_interval=0.1,
                                   maintenance_interval=0.2, visibility_timeout=lease,
                                   grace_period=10.0)

    def _app(self, url: str) -> Conveyor:
        app = Conveyor(url, retry=RetryPolicy(base=0.05, cap=0.2))

        @app.task(name=TASK, queue=QUEUE, max_attempts=50, timeout=30)
        def record(n: int) -> int:
            with self._lock:
                self.runs[n] += 1
            return n

        return app

    def start(self) -> Load:
        self.worker.start()
        for p in self.producers:
            p.start()
        return self

    def wait_acked(self, more: int, timeout: float = 30) -> None:
        """Until every producer has ``more`` acknowledged enqueues beyond its count now."""
        goals = [len(p.acked) + more for p in self.producers]
        for p, goal in zip(self.producers, goals, strict=True):
            wait_until(lambda p=p, goal=goal: len(p.acked) >= goal, timeout,
                       f"{more} more acknowledged enqueues of producer {p.k} "
                       f"(errors: {p.errors[-3:]})")

    def finish(self, timeout: float = 60, *, lost_ok: bool = False) -> None:
        """Stop producing, then wait until no job is waiting or running and every job whose
        enqueue was acknowledged ran (``lost_ok``: the store holds no unfinished job, where a
        failover may have lost some)."""
        for p in self.producers:
            p.stop()
        backend = self.worker_app.backend

        def drained() -> bool:
            stats = backend.stats()
            busy = sum(q.available + q.scheduled + q.running + q.waiting
                       for q in stats.queues if q.queue in self.queues)
            return busy == 0 and (lost_ok or not self.unrun())

        try:
            wait_until(drained, timeout, f"the drain (acknowledged, never run: "
                       f"{self.unrun()[:10]}; worker errors: {self.worker.errors})", 0.1)
        finally:
            self.worker.stop()
            self.worker.join()

    def unrun(self) -> list[int]:
        """The acknowledged jobs that never ran."""
        with self._lock:
            runs = dict(self.runs)
        return [n for p in self.producers for n in p.acked if runs.get(n, 0) == 0]

    def duplicates(self) -> int:
        with self._lock:
            return sum(c - 1 for c in self.runs.values() if c > 1)

    def states(self, producer: Producer) -> collections.Counter[str]:
        """The final state of each of a producer's acknowledged jobs (by id; a job whose id
        holds another job now, or none, is 'gone')."""
        out: collections.Counter[str] = collections.Counter()
        for n, job_id in producer.acked.items():
            try:
                job = self.worker_app.get_job(job_id)
            except Exception:
                out["gone"] += 1
                continue
            out[str(job.state) if job.args == {"n": n} else "gone"] += 1
        return out

    @staticmethod
    def backend(app: Conveyor) -> RedisBackend:
        b = app.backend
        assert isinstance(b, RedisBackend)
        return b

    def redirects(self) -> collections.Counter[str]:
        """The cluster redirections every backend of this load met (every partition's)."""
        total: collections.Counter[str] = collections.Counter()
        for app in [self.worker_app, *[p.app for p in self.producers]]:
            for part in getattr(app.backend, "parts", [app.backend]):
                total.update(part._transport.redirects)
        return total

    def close(self) -> None:
        for p in self.producers:
            p.stop()
            p.app.close()
        self.worker.stop()
        self.worker.join()
        self.worker_app.close()


class Producer:
    """One job at a time, numbered from ``k * 1_000_000``: an enqueue refused before it was sent
    ("nothing was done") is sent again; one whose reply was lost is counted unsure."""

    def __init__(self, app: Conveyor, k: int, queues: tuple[str, ...] = (QUEUE,)) -> None:
        self.app, self.k, self.queues = app, k, queues
        self.acked: dict[int, int] = {}  # job number -> id
        self.unsure: list[int] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"producer-{k}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)

    def _run(self) -> None:
        task: Any = self.app.tasks[TASK]
        calls = [task.options(queue=q) for q in self.queues]
        n = self.k * 1_000_000
        while not self._stop.is_set():
            try:
                job = calls[n % len(calls)].enqueue(n)
            except StoreUnavailable as exc:
                self.errors.append(str(exc))
                if "nothing was done" not in str(exc):
                    self.unsure.append(n)
                    n += 1
                time.sleep(0.01)
                continue
            self.acked[n] = job.id
            n += 1
            time.sleep(0.002)
