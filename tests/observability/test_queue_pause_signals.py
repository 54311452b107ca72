"""A paused queue (issue 38) in the metrics and the alerts: ``conveyor_queue_paused`` says 1 or
0 per queue, and the rules that mean "this queue is stuck" (oldest job age, no live worker) let
a paused queue be: its jobs wait because an operator said so. On every backend."""

from __future__ import annotations

from support import T0, enqueue_one

from conveyor.alerts import Alerting, DeadJobs, NoLiveWorkers, OldestJobAge, QueueDepth
from conveyor.backends.base import Backend
from conveyor.metrics import StoreCollector


def paused_gauge(backend: Backend) -> dict[str, float]:
    families = {f.name: f for f in StoreCollector(backend).collect()}
    return {s.labels["queue"]: s.value for s in families["conveyor_queue_paused"].samples}


def test_the_paused_gauge_is_one_per_paused_queue(backend: Backend) -> None:
    enqueue_one(backend, queue="mail")
    enqueue_one(backend, queue="other")
    assert paused_gauge(backend) == {"mail": 0, "other": 0}
    backend.pause_queue("mail")
    backend.pause_queue("idle")  # no job at all: still a queue an operator paused
    assert paused_gauge(backend) == {"mail": 1, "other": 0, "idle": 1}
    backend.resume_queue("mail")
    assert paused_gauge(backend)["mail"] == 0


def test_a_paused_queue_is_not_stuck(backend: Backend) -> None:
    alerting = Alerting(backend, [OldestJobAge(max_age=60), NoLiveWorkers()], [])
    enqueue_one(backend, queue="mail", now=T0)
    fired = alerting.evaluate(now=T0 + 90)
    assert sorted(i.key for i in fired) == ["no_live_workers:mail", "oldest_job_age:mail"]
    backend.pause_queue("mail", now=T0 + 91)
    resolved = alerting.evaluate(now=T0 + 120)
    assert sorted((i.status, i.key) for i in resolved) == [
        ("resolved", "no_live_workers:mail"), ("resolved", "oldest_job_age:mail")]
    assert alerting.evaluate(now=T0 + 3600) == []  # however long it stays paused
    backend.resume_queue("mail", now=T0 + 3601)
    again = alerting.evaluate(now=T0 + 3602)
    assert sorted((i.status, i.key) for i in again) == [
        ("firing", "no_live_workers:mail"), ("firing", "oldest_job_age:mail")]


def test_depth_and_dead_rules_still_watch_a_paused_queue(backend: Backend) -> None:
    # A paused queue that keeps filling up is still worth knowing about.
    alerting = Alerting(backend, [QueueDepth(max_depth=1), DeadJobs()], [])
    backend.pause_queue("mail", now=T0)
    enqueue_one(backend, queue="mail", now=T0)
    enqueue_one(backend, queue="mail", now=T0)
    assert [i.key for i in alerting.evaluate(now=T0 + 1)] == ["queue_depth:mail"]
