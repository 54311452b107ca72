"""Alerts fire once per incident and resolve, on every backend; webhooks retry and time out."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, ClassVar

import pytest
from support import T0, enqueue_one

from conveyor.alerts import (
    Alerting,
    DeadJobs,
    Incident,
    JobsPastTimeout,
    LeaseExpiryRate,
    NoLiveWorkers,
    OldestJobAge,
    QueueDepth,
    Webhook,
)
from conveyor.backends.base import Backend, ErrorInfo, Lease, WorkerInfo


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, incident: Incident) -> None:
        self.seen.append((incident.status, incident.key))


def test_depth_fires_once_and_resolves(backend: Backend) -> None:
    rec = Recorder()
    alerting = Alerting(backend, [QueueDepth(max_depth=2)], [rec])
    for _ in range(3):
        enqueue_one(backend, now=T0)
    assert [i.key for i in alerting.evaluate(now=T0 + 1)] == ["queue_depth:default"]
    assert alerting.evaluate(now=T0 + 2) == []  # still firing: no second notification
    assert alerting.evaluate(now=T0 + 3) == []
    backend.claim("default", 2, worker_id="w", lease_s=60, now=T0 + 4)
    [resolved] = alerting.evaluate(now=T0 + 5)
    assert resolved.status == "resolved" and resolved.resolved_at == pytest.approx(T0 + 5)
    assert rec.seen == [("firing", "queue_depth:default"), ("resolved", "queue_depth:default")]


def test_oldest_age_uses_store_time(backend: Backend) -> None:
    rec = Recorder()
    alerting = Alerting(backend, [OldestJobAge(max_age=60)], [rec])
    enqueue_one(backend, now=T0)
    assert alerting.evaluate(now=T0 + 30) == []
    [fired] = alerting.evaluate(now=T0 + 90)
    assert fired.key == "oldest_job_age:default" and fired.value == pytest.approx(90, abs=0.01)


def test_dead_job_and_no_live_worker(backend: Backend) -> None:
    rec = Recorder()
    alerting = Alerting(backend, [DeadJobs(), NoLiveWorkers()], [rec])
    job_id = enqueue_one(backend, now=T0, max_attempts=1)
    assert [i.key for i in alerting.evaluate(now=T0 + 1)] == ["no_live_workers:default"]
    backend.record_worker(WorkerInfo(id="w1", queues=["default"], concurrency=1, host="h", pid=1,
                                     started_at=T0, last_seen=T0), now=T0 + 2)
    [job] = backend.claim("default", 1, worker_id="w1", lease_s=60, now=T0 + 2)
    backend.kill(Lease(job.id, job.lease_token or ""), ErrorInfo(kind="rejected", message="no"), now=T0 + 3)
    changes = alerting.evaluate(now=T0 + 4)
    assert sorted((i.status, i.key) for i in changes) == [
        ("firing", "dead_jobs:default"), ("resolved", "no_live_workers:default")]
    assert backend.redrive([job_id], now=T0 + 5) == 1
    # Redriven: the DLQ is empty again; the job waits and worker w1 is still live.
    assert [(i.status, i.key) for i in alerting.evaluate(now=T0 + 6)] == [("resolved", "dead_jobs:default")]


def test_lease_expiry_rate(backend: Backend) -> None:
    alerting = Alerting(backend, [LeaseExpiryRate(per_minute=2)], [])
    for _ in range(5):
        enqueue_one(backend, now=T0)
    assert alerting.evaluate(now=T0) == []  # first look only records the counter
    backend.claim("default", 5, worker_id="w", lease_s=10, now=T0)
    assert backend.reap(now=T0 + 30).count == 5
    [fired] = alerting.evaluate(now=T0 + 60)  # 5 expiries in one minute
    assert fired.key == "lease_expiry_rate:default" and fired.value == pytest.approx(5.0)
    [resolved] = alerting.evaluate(now=T0 + 120)
    assert resolved.status == "resolved"


def test_jobs_past_timeout(backend: Backend) -> None:
    alerting = Alerting(backend, [JobsPastTimeout(grace=5)], [])
    enqueue_one(backend, now=T0, timeout=10)
    backend.claim("default", 1, worker_id="stuck-worker", lease_s=1000, now=T0)
    assert alerting.evaluate(now=T0 + 12) == []
    [fired] = alerting.evaluate(now=T0 + 16)
    assert fired.key == "jobs_past_timeout:stuck-worker"


class _Hook(BaseHTTPRequestHandler):
    # Set per test on a fresh subclass (see the hook fixture).
    statuses: ClassVar[list[int]]
    bodies: ClassVar[list[dict[str, Any]]]
    delay: ClassVar[float]

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        type(self).bodies.append(json.loads(self.rfile.read(length)))
        time.sleep(type(self).delay)
        status = type(self).statuses.pop(0) if type(self).statuses else 200
        self.send_response(status)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hook() -> Iterator[tuple[str, type[_Hook]]]:
    handler = type("Hook", (_Hook,), {"statuses": [], "bodies": [], "delay": 0.0})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/alerts", handler
    finally:
        server.shutdown()
        server.server_close()


def _incident() -> Incident:
    return Incident(key="queue_depth:default", rule="queue_depth", summary="deep", value=5, threshold=2,
                    queue="default", started_at=T0)


def test_webhook_posts_json_and_retries_a_failing_receiver(hook: tuple[str, type[_Hook]]) -> None:
    url, handler = hook
    handler.statuses = [500, 503]
    assert Webhook(url, backoff=0.01, retries=3).deliver(_incident()) is True
    assert len(handler.bodies) == 3
    assert handler.bodies[-1]["status"] == "firing"
    assert handler.bodies[-1]["alert"]["key"] == "queue_depth:default"


def test_webhook_gives_up_after_its_retries(hook: tuple[str, type[_Hook]]) -> None:
    url, handler = hook
    handler.statuses = [500] * 10
    assert Webhook(url, backoff=0.01, retries=2).deliver(_incident()) is False
    assert len(handler.bodies) == 3


def test_webhook_never_waits_past_its_timeout(hook: tuple[str, type[_Hook]]) -> None:
    url, handler = hook
    handler.delay = 2.0
    started = time.monotonic()
    assert Webhook(url, timeout=0.2, retries=0).deliver(_incident()) is False
    assert time.monotonic() - started < 1.5


def test_cli_alerts_once(store_url: str) -> None:
    from conveyor.backends import open_backend

    b = open_backend(store_url)
    enqueue_one(b, now=T0)
    b.close()
    cmd = [sys.executable, "-m", "conveyor", "--url", store_url, "alerts", "--once", "--depth", "0"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr
    assert "FIRING warning queue_depth:default" in out.stdout
    assert "FIRING critical no_live_workers:default" in out.stdout
    quiet = subprocess.run([*cmd[:-2], "--allow-no-workers"], capture_output=True, text=True, timeout=60)
    assert quiet.returncode == 0 and "no alerts firing" in quiet.stdout, quiet.stdout + quiet.stderr
