"""The dashboard's memory of the recent past: a ring of ``stats()`` samples, and the alerts
that fire on them.

These are the live charts: throughput and failures over time as the differences between
samples this process took. The store's own history (historyview.py) is charted beside them.
A background thread samples every ``interval`` seconds (and every page that reads stats adds
its reading), keeping the last ``history`` samples: an hour at the defaults. A restarted
dashboard starts with empty live charts.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..alerts import (
    DeadJobs,
    Finding,
    JobsPastTimeout,
    NoLiveWorkers,
    OldestJobAge,
    Rule,
    StuckSlots,
)
from ..backends.base import Backend, QueueStats, Stats
from ..errors import Unsupported

log = logging.getLogger("conveyor.dashboard")


def default_rules() -> list[Rule]:
    return [DeadJobs(), NoLiveWorkers(), JobsPastTimeout(), StuckSlots(), OldestJobAge(300.0)]


@dataclass(frozen=True)
class Sample:
    at: float  # the store's clock
    queues: dict[str, QueueStats]
    workers: int


@dataclass(frozen=True)
class Firing:
    rule: str
    severity: str
    finding: Finding
    since: float


class Sampler:
    def __init__(self, backend: Callable[[], Backend], *, interval: float = 5.0, history: int = 720,
                 rules: Sequence[Rule] | None = None) -> None:
        self._backend = backend
        self.interval = interval
        self.samples: deque[Sample] = deque(maxlen=history)
        self.rules = list(default_rules() if rules is None else rules)
        self.firing: dict[str, Firing] = {}
        self.last_error: str | None = None
        self._memory: dict[str, object] = {}
        self._lock = threading.Lock()
        self._eval_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------
    def ensure_started(self) -> None:
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run,
                                                name="conveyor-dashboard-sampler", daemon=True)
                self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception as exc:  # the store is away: say so on the page, keep trying
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("dashboard: sampling the store failed: %s", exc)
            self._stop.wait(self.interval)

    # -- sampling ------------------------------------------------------------------------
    def sample(self) -> Stats:
        backend = self._backend()
        stats = backend.stats()
        self.observe(stats)
        self.last_error = None
        return stats

    def observe(self, stats: Stats) -> None:
        """Record a fresh reading and evaluate the alert rules on it (the overview calls this
        with the stats it read, so the alerts it shows are as fresh as its numbers)."""
        self.offer(stats)
        self._evaluate(stats, self._backend())

    def offer(self, stats: Stats) -> None:
        """Keep ``stats`` as a sample unless the last one is very recent (pages read stats too)."""
        with self._lock:
            if self.samples and stats.now - self.samples[-1].at < self.interval / 2:
                return
            if self.samples and stats.now < self.samples[-1].at:
                return  # a slower reader finishing after a newer sample
            queues = {q.queue: q for q in stats.queues}
            self.samples.append(Sample(stats.now, queues, len(stats.workers)))

    def snapshot(self) -> list[Sample]:
        with self._lock:
            return list(self.samples)

    def _evaluate(self, stats: Stats, backend: Backend) -> None:
        seen: dict[str, tuple[Rule, Finding]] = {}
        with self._eval_lock:  # rules keep memory between calls (rates): one evaluation at a time
            for rule in list(self.rules):
                try:
                    for finding in rule.check(stats, backend, self._memory):
                        seen[finding.key] = (rule, finding)
                except Unsupported as exc:
                    # It needs what the store cannot answer (a broker alone): off, said once.
                    self.rules = [r for r in self.rules if r is not rule]
                    log.warning("dashboard: alert rule %s is off on this store: %s", rule.name, exc)
                except Exception:
                    log.exception("dashboard: alert rule %s failed", rule.name)
        with self._lock:
            previous = self.firing
            self.firing = {
                key: Firing(rule.name, rule.severity, finding,
                            previous[key].since if key in previous else stats.now)
                for key, (rule, finding) in seen.items()
            }

    def alerts(self) -> list[Firing]:
        order = {"critical": 0, "warning": 1}
        with self._lock:
            return sorted(self.firing.values(),
                          key=lambda f: (order.get(f.severity, 2), f.since, f.finding.key))
