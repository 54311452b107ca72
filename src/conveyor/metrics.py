"""Prometheus metrics: what this process did (counters, histograms) and what the store holds
(gauges read at scrape time).

Store-wide numbers (depth, oldest waiting age, dead jobs, live workers, lease expiries) are
read from the store when scraped, so every exporter reports the same value for the whole
fleet; aggregate them with ``max by (queue)``, never ``sum``. Per-process numbers (attempts,
run times, lag, stuck slots) are counters, histograms and gauges of this process: ``sum`` them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .job import JobState

if TYPE_CHECKING:
    from prometheus_client import Metric

    from .backends.base import Backend

log = logging.getLogger("conveyor.metrics")

RUN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 3600)
# Succeeded and cancelled counts grow with retention; the scrape leaves them out (see stats()).
COUNTED_STATES = (JobState.WAITING, JobState.SCHEDULED, JobState.AVAILABLE, JobState.RUNNING,
                  JobState.DEAD)
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
               900, 3600)


class StoreCollector(Collector):
    """Gauges over the whole store, read by one stats() call per scrape."""

    def __init__(self, backend: Backend, *, worker_ttl: float = 60.0) -> None:
        self.backend = backend
        self.worker_ttl = worker_ttl

    def collect(self) -> Iterator[Metric]:
        """Read the store once and yield the gauges (``conveyor_store_up`` is 0 if it failed)."""
        started = time.perf_counter()
        up = GaugeMetricFamily("conveyor_store_up",
                               "1 if the store answered the last scrape, else 0")
        try:
            stats = self.backend.stats(worker_ttl=self.worker_ttl, finished=False)
        except Exception as exc:  # a scrape must not fail because the store is away: say so instead
            log.warning("metrics: store stats failed: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        depth = GaugeMetricFamily(
            "conveyor_queue_jobs", "Unfinished and dead jobs in the store by queue and state",
            labels=["queue", "state"],
        )
        waiting = GaugeMetricFamily("conveyor_queue_depth", "Jobs due and waiting for a worker",
                                    labels=["queue"])
        age = GaugeMetricFamily(
            "conveyor_queue_oldest_job_age_seconds",
            "How long the oldest due job has waited (0 when none waits)", labels=["queue"],
        )
        dead = GaugeMetricFamily("conveyor_dead_jobs", "Jobs in the dead-letter queue",
                                 labels=["queue"])
        expiries = CounterMetricFamily(
            "conveyor_lease_expiries", "Leases that expired (worker died or stalled), store-wide",
            labels=["queue"],
        )
        expired = GaugeMetricFamily(
            "conveyor_expired_leases",
            "Running jobs whose lease ran out, not yet taken back by a reaper", labels=["queue"],
        )
        workers = GaugeMetricFamily("conveyor_workers_live",
                                    "Workers with a recent heartbeat serving the queue",
                                    labels=["queue"])
        paused = GaugeMetricFamily("conveyor_queue_paused",
                                   "1 while the queue is paused (no worker claims its jobs)",
                                   labels=["queue"])
        serving: dict[str, int] = {}
        for w in stats.workers:
            for name in w.queues:
                serving[name] = serving.get(name, 0) + 1
        for q in stats.queues:
            for state in COUNTED_STATES:
                depth.add_metric([q.queue, state.value], getattr(q, state.value))
            waiting.add_metric([q.queue], q.depth)
            age.add_metric([q.queue], q.oldest_available_age or 0.0)
            dead.add_metric([q.queue], q.dead)
            expiries.add_metric([q.queue], q.lease_expiries)
            expired.add_metric([q.queue], q.expired_leases)
            workers.add_metric([q.queue], serving.pop(q.queue, 0))
            paused.add_metric([q.queue], 1 if q.paused else 0)
        for queue, n in serving.items():  # workers on queues that have never held a job
            workers.add_metric([queue], n)
        yield from (depth, waiting, age, dead, expiries, expired, workers, paused)
        took = GaugeMetricFamily("conveyor_store_scrape_seconds",
                                 "Time the store took to answer this scrape")
        took.add_metric([], time.perf_counter() - started)
        yield took


class Metrics:
    """One registry per exporter; the worker records into it, the HTTP endpoint serves it."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.attempts = Counter(
            "conveyor_job_attempts", "Job attempts finished by this process, by outcome",
            ["queue", "task", "outcome"], registry=r,
        )
        self.timeouts = Counter(
            "conveyor_job_timeouts", "Attempts stopped at their timeout (also counted in attempts)",
            ["queue", "task"], registry=r,
        )
        self.run_seconds = Histogram(
            "conveyor_job_run_seconds", "Time a job's task ran, per attempt", ["queue", "task"],
            buckets=RUN_BUCKETS, registry=r,
        )
        self.lag_seconds = Histogram(
            "conveyor_job_lag_seconds", "Worker lag: from a job being due to an attempt starting",
            ["queue"], buckets=LAG_BUCKETS, registry=r,
        )
        self.leases_lost = Counter(
            "conveyor_leases_lost", "Jobs this process was running whose lease it lost",
            ["queue"], registry=r,
        )
        self.reaped = Counter(
            "conveyor_reaped_jobs", "Expired leases this process's reaper returned or killed",
            ["outcome"], registry=r,
        )
        self.enqueued = Counter(
            "conveyor_jobs_enqueued", "Jobs enqueued by this process", ["queue", "task"],
            registry=r,
        )
        self.refused = Counter(
            "conveyor_enqueue_refused",
            "Enqueues refused because the queue was at its max_depth (QueueFull)",
            ["queue"], registry=r,
        )
        self.stuck_slots = Gauge(
            "conveyor_worker_stuck_slots",
            "Slots of this process's workers held by sync tasks still running past their timeout "
            "(threads cannot be killed; each such slot takes no new job until its call returns)",
            registry=r,
        )
        self._store: StoreCollector | None = None

    def watch_store(self, backend: Backend) -> None:
        """Also export the store-wide gauges, read at scrape time."""
        if self._store is None:
            self._store = StoreCollector(backend)
            self.registry.register(self._store)

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Serve /metrics over HTTP from a daemon thread."""
        from prometheus_client import start_http_server

        start_http_server(port, addr=addr, registry=self.registry)
        log.info("metrics on http://%s:%d/metrics", addr, port)
