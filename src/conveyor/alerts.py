"""Alert rules over the store's numbers, with log and webhook actions.

A rule turns one ``stats()`` snapshot into the incidents it sees now (keyed, e.g. per queue).
The evaluator fires an incident when it first appears and resolves it when it goes away,
so a condition that lasts an hour sends two notifications, not one per tick.

Run one evaluator per store (``conveyor alerts``, or ``Alerting(...).start()`` in one
process): evaluators do not coordinate, so two of them notify twice.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol

from .backends.base import Backend, Stats
from .errors import Unsupported
from .job import JobState

log = logging.getLogger("conveyor.alerts")


@dataclass
class Incident:
    """One alert from the moment it fires until it resolves; what actions receive.

    ``key`` names the incident (rule and queue, e.g. ``dead_jobs:emails``), so a condition
    that stays true is one incident, not one per evaluation. ``status`` is ``"firing"``,
    then ``"resolved"`` with ``resolved_at`` set.
    """

    key: str
    rule: str
    summary: str
    value: float
    threshold: float
    queue: str | None = None
    severity: str = "warning"
    status: str = "firing"  # or "resolved"
    started_at: float = 0.0
    resolved_at: float | None = None

    def to_dict(self) -> dict[str, object]:
        """Every field, for JSON (the webhook's ``alert`` object)."""
        return asdict(self)


@dataclass(frozen=True)
class Finding:
    """What a rule sees in one snapshot."""

    key: str
    summary: str
    value: float
    threshold: float
    queue: str | None = None


class Rule(Protocol):
    """What ``Alerting`` needs of a rule: a name, a severity and a ``check``.

    The built-in rules are dataclasses; any object with these members works.
    """

    name: str
    severity: str

    def check(self, stats: Stats, backend: Backend, memory: dict[str, object]) -> list[Finding]:
        """The findings in this snapshot of the store; an empty list when all is well.

        ``memory`` persists between evaluations (for rates); namespace its keys by rule.
        """
        ...


def _wanted(queue: str, queues: Sequence[str] | None) -> bool:
    return queues is None or queue in queues


@dataclass
class DeadJobs:
    """The dead-letter queue of a queue holds more than ``threshold`` jobs (default: any)."""

    threshold: int = 0
    queues: Sequence[str] | None = None
    name: str = "dead_jobs"
    severity: str = "critical"

    def check(self, stats: Stats, backend: Backend, memory: dict[str, object]) -> list[Finding]:
        """Findings for this snapshot (see ``Rule.check``)."""
        return [
            Finding(f"{self.name}:{q.queue}", f"{q.dead} dead job(s) on queue {q.queue}", q.dead,
                    self.threshold, q.queue)
            for q in stats.queues if _wanted(q.queue, self.queues) and q.dead > self.threshold
        ]


@dataclass
class QueueDepth:
    """More than ``max_depth`` jobs are due and waiting on a queue."""

    max_depth: int
    queues: Sequence[str] | None = None
    name: str = "queue_depth"
    severity: str = "warning"

    def check(self, stats: Stats, backend: Backend, memory: dict[str, object]) -> list[Finding]:
        """Findings for this snapshot (see ``Rule.check``)."""
        return [
            Finding(f"{self.name}:{q.queue}",
                    f"queue {q.queue} has {q.depth} waiting jobs (limit {self.max_depth})",
                    q.depth, self.max_depth, q.queue)
            for q in stats.queues if _wanted(q.queue, self.queues) and q.depth > self.max_depth
        ]


@dataclass
class OldestJobAge:
    """The oldest due job of a queue has waited more than ``max_age`` seconds. A paused queue
    (Backend.pause_queue) is passed over: its jobs wait because an operator said so."""

    max_age: float
    queues: Sequence[str] | None = None
    name: str = "oldest_job_age"
    severity: str = "warning"

    def check(self, stats: Stats, backend: Backend, memory: dict[str, object]) -> list[Finding]:
        """Findings for this snapshot (see ``Rule.check``)."""
        return [
            Finding(f"{self.name}:{q.queue}",
                    f"oldest job on queue {q.queue} has waited {q.oldest_available_age:.0f}s "
                    f"(limit {self.max_age:g}s)",
                    q.oldest_available_age, self.max_age, q.queue)
            for q in stats.queues
            if _wanted(q.queue, self.queues) and q.oldest_available_age is not None
            and q.oldest_available_age > self.max_age and not q.paused
        ]


@dataclass
class NoLiveWorkers:
    """A queue has jobs waiting and no worker with a recent heartbeat serves it (a paused
    queue is passed over: nothing would claim them anyway)."""

    queues: Sequence[str] | None = None
    name: str = "no_live_workers"
    severity: str = "critical"

    def check(self, stats: Stats, backend: Backend, memory: dict[str, object]) -> list[Finding]:
        """Findings for this snapshot (see ``Rule.check``)."""
        served = {q for w in stats.workers for q in w.queues}
        return [
            Finding(f"{self.name}:{q.queue}",
                    f"queue {q.queue} has {q.depth} waiting job(s) and no live worker",
                    q.depth, 0, q.queue)
            for q in stats.queues
            if _wanted(q.queue, self.queues) and q.depth > 0 and q.queue not in served
            and not q.paused
        ]


@dataclass
class LeaseExpiryRate:
    """More than ``per_minute`` leases expired per minute on a queue since the last check
    (workers are dying, or jobs outrun their heartbeat)."""

    per_minute: float
    queues: Sequence[str] | None = None
    name: str = "lease_expiry_rate"
    severity: str = "warning"

    def check(self, stats: Stats, backend: Backend, memory: dict[str, object]) -> list[Finding]:
        """Findings for this snapshot (see ``Rule.check``)."""
        previous = memory.get(self.name)
        current = {q.queue: q.lease_expiries for q in stats.queues}
        memory[self.name] = (stats.now, current)
        if not isinstance(previous, tuple):
            return []
        then, counts = previous
        minutes = max((stats.now - then) / 60.0, 1e-9)
        findings = []
        for queue, total in current.items():
            rate = (total - counts.get(queue, 0)) / minutes
            if _wanted(queue, self.queues) and rate > self.per_minute:
                summary = (f"{rate:.1f} lease expiries/min on queue {queue} "
                           f"(limit {self.per_minute:g})")
                findings.append(Finding(f"{self.name}:{queue}", summary, rate, self.per_minute,
                                        queue))
        return findings


@dataclass
class JobsPastTimeout:
    """Jobs still running ``grace`` seconds past their timeout: a worker is blocked (an event
    loop stalled by sync code, or too stalled to enforce the timeout). A sync task whose timeout
    did fire is settled and so not seen here, though its thread may still run: see StuckSlots."""

    grace: float = 30.0
    limit: int = 1000
    name: str = "jobs_past_timeout"
    severity: str = "critical"

    def check(self, stats: Stats, backend: Backend, memory: dict[str, object]) -> list[Finding]:
        """Findings for this snapshot (see ``Rule.check``)."""
        stuck: dict[str, list[int]] = {}
        page = backend.list_jobs(state=JobState.RUNNING, limit=self.limit)
        for job in page.jobs:
            if job.attempted_at is None:
                continue
            if stats.now > job.attempted_at + job.timeout + self.grace:
                stuck.setdefault(job.worker_id or "?", []).append(job.id)
        return [
            Finding(f"{self.name}:{worker}",
                    f"worker {worker} runs job(s) {ids[:10]} past their timeout", len(ids), 0)
            for worker, ids in stuck.items()
        ]


@dataclass
class StuckSlots:
    """A worker has more than ``threshold`` stuck slots (default: any): sync tasks still running
    past their timeout. Their jobs were already failed or retried by the timeout, so they are no
    longer running in the store and ``jobs_past_timeout`` cannot see them; their threads, which
    cannot be killed, hold the slots until the calls return. Read from the workers' heartbeats."""

    threshold: int = 0
    name: str = "stuck_slots"
    severity: str = "critical"

    def check(self, stats: Stats, backend: Backend, memory: dict[str, object]) -> list[Finding]:
        """Findings for this snapshot (see ``Rule.check``)."""
        return [
            Finding(f"{self.name}:{w.id}",
                    f"worker {w.id} has {w.stuck} of {w.concurrency} slot(s) stuck on tasks "
                    "running past their timeout", w.stuck, self.threshold)
            for w in stats.workers if w.stuck > self.threshold
        ]


Action = Callable[[Incident], None]


def log_action(incident: Incident) -> None:
    """Log the incident on ``conveyor.alerts``: ERROR for critical, WARNING otherwise, INFO when
    resolved."""
    level = logging.INFO if incident.status == "resolved" else (
        logging.ERROR if incident.severity == "critical" else logging.WARNING)
    log.log(level, "alert %s %s: %s", incident.status, incident.key, incident.summary)


@dataclass
class Webhook:
    """POST each firing/resolved incident as JSON. Delivery runs on its own thread with a
    timeout per try and bounded retries, so a slow receiver never stalls evaluation."""

    url: str
    timeout: float = 5.0
    retries: int = 3
    backoff: float = 1.0
    headers: dict[str, str] = field(default_factory=dict)

    def __call__(self, incident: Incident) -> None:
        """Deliver in the background (see ``deliver``) and return at once."""
        threading.Thread(target=self.deliver, args=(incident,), name="conveyor-webhook",
                         daemon=True).start()

    def deliver(self, incident: Incident) -> bool:
        """POST ``{"status": ..., "alert": {...}}`` now, retrying with backoff; True if a try got
        a 2xx."""
        body = json.dumps({"status": incident.status, "alert": incident.to_dict()}).encode()
        delay = self.backoff
        for attempt in range(1, self.retries + 2):
            request = urllib.request.Request(
                self.url, data=body, method="POST",
                headers={"Content-Type": "application/json", "User-Agent": "conveyor-alerts",
                         **self.headers},
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    if 200 <= response.status < 300:
                        return True
                    reason = f"HTTP {response.status}"
            except (urllib.error.URLError, OSError, TimeoutError) as exc:
                reason = str(exc)
            if attempt <= self.retries:
                log.warning("alert webhook try %d failed (%s); retrying in %.1fs",
                            attempt, reason, delay)
                time.sleep(delay)
                delay *= 2
            else:
                log.error("alert webhook gave up after %d tries for %s: %s",
                          attempt, incident.key, reason)
        return False


class Alerting:
    """Evaluate rules against the store every ``interval`` seconds and notify on changes."""

    def __init__(self, backend: Backend, rules: Sequence[Rule],
                 actions: Sequence[Action] = (log_action,), *, interval: float = 15.0) -> None:
        self.backend = backend
        self.rules = list(rules)
        self.actions = list(actions)
        self.interval = interval
        self.firing: dict[str, Incident] = {}
        self._memory: dict[str, object] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def evaluate(self, *, now: float | None = None) -> list[Incident]:
        """One pass: returns the incidents that fired or resolved in it."""
        stats = self.backend.stats(now=now)
        seen: dict[str, tuple[Rule, Finding]] = {}
        for rule in list(self.rules):
            try:
                for finding in rule.check(stats, self.backend, self._memory):
                    seen[finding.key] = (rule, finding)
            except Unsupported as exc:
                # It needs what the store cannot answer (a broker alone): off, said once.
                self.rules = [r for r in self.rules if r is not rule]
                log.warning("alert rule %s is off on this store: %s", rule.name, exc)
            except Exception:
                log.exception("alert rule %s failed", rule.name)
        changes: list[Incident] = []
        for key, (rule, finding) in seen.items():
            if key in self.firing:
                current = self.firing[key]
                current.value, current.summary = finding.value, finding.summary
                continue
            incident = Incident(key=key, rule=rule.name, summary=finding.summary,
                                value=finding.value, threshold=finding.threshold,
                                queue=finding.queue, severity=rule.severity, started_at=stats.now)
            self.firing[key] = incident
            changes.append(incident)
        for key in list(self.firing):
            if key not in seen:
                incident = self.firing.pop(key)
                incident.status, incident.resolved_at = "resolved", stats.now
                changes.append(incident)
        for incident in changes:
            for action in self.actions:
                try:
                    action(incident)
                except Exception:
                    log.exception("alert action failed for %s", incident.key)
        return changes

    def run(self) -> None:
        """Evaluate every ``interval`` seconds until ``stop()`` (blocks the calling thread)."""
        while not self._stop.is_set():
            try:
                self.evaluate()
            except Exception as exc:
                log.error("alert evaluation failed: %s", exc)
            self._stop.wait(self.interval)

    def start(self) -> Alerting:
        """Run ``run()`` on a daemon thread; returns self."""
        self._thread = threading.Thread(target=self.run, name="conveyor-alerts", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the loop and wait (up to 5 s) for its thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
