"""Prometheus metrics: per-process counters and histograms from a real worker, store-wide
gauges read at scrape time, and the HTTP endpoint of a worker process checked by promtool."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support import running_worker, wait_for_job, wait_until

from conveyor import Conveyor, JobState, Reject, Retry, RetryPolicy


def samples(app: Conveyor) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    assert app.metrics is not None
    text = generate_latest(app.metrics.registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(data: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return data.get((name, tuple(sorted(labels.items()))), 0.0)


def test_worker_records_outcomes_run_time_lag_and_store_gauges(app: Conveyor) -> None:
    metrics = app.enable_metrics()

    @app.task(name="ok")
    def ok(n: int) -> int:
        return n

    @app.task(name="flaky", retry=RetryPolicy(base=0.01))
    def flaky() -> str:
        from conveyor import current_job

        ctx = current_job()
        assert ctx is not None
        if ctx.attempt == 1:
            raise Retry(delay=0.01)
        return "ok"

    @app.task(name="bad")
    def bad() -> None:
        raise Reject("no")

    @app.task(name="slow", timeout=0.05, max_attempts=1)
    async def slow() -> None:
        await asyncio.sleep(5)

    jobs = [ok.enqueue(i) for i in range(5)] + [flaky.enqueue(), bad.enqueue(), slow.enqueue()]
    parked = ok.options(queue="parked").enqueue(99)  # nobody serves this queue: it waits
    with running_worker(app, concurrency=4):
        for j in jobs:
            wait_for_job(app, j.id)
    assert app.get_job(parked.id).state is JobState.AVAILABLE

    data = samples(app)
    assert value(data, "conveyor_jobs_enqueued_total", queue="default", task="ok") == 5
    assert value(data, "conveyor_jobs_enqueued_total", queue="parked", task="ok") == 1
    assert value(data, "conveyor_job_attempts_total", queue="default", task="ok", outcome="succeeded") == 5
    assert value(data, "conveyor_job_attempts_total", queue="default", task="flaky", outcome="retried") == 1
    assert value(data, "conveyor_job_attempts_total", queue="default", task="flaky", outcome="succeeded") == 1
    assert value(data, "conveyor_job_attempts_total", queue="default", task="bad", outcome="dead") == 1
    assert value(data, "conveyor_job_attempts_total", queue="default", task="slow", outcome="dead") == 1
    assert value(data, "conveyor_job_timeouts_total", queue="default", task="slow") == 1
    assert value(data, "conveyor_job_run_seconds_count", queue="default", task="ok") == 5
    assert value(data, "conveyor_job_lag_seconds_count", queue="default") == 9  # every attempt
    # Store-wide, read at scrape time.
    assert value(data, "conveyor_store_up") == 1
    assert value(data, "conveyor_queue_depth", queue="parked") == 1
    assert value(data, "conveyor_queue_depth", queue="default") == 0
    assert value(data, "conveyor_queue_oldest_job_age_seconds", queue="parked") >= 0
    assert value(data, "conveyor_dead_jobs", queue="default") == 2
    assert value(data, "conveyor_queue_jobs", queue="default", state="dead") == 2
    # Finished history is not counted at scrape time: it grows with retention.
    assert ("conveyor_queue_jobs", (("queue", "default"), ("state", "succeeded"))) not in data
    assert value(data, "conveyor_lease_expiries_total", queue="default") == 0
    assert metrics.registry is app.metrics.registry


def test_jobs_waiting_for_their_parents_are_a_state_of_the_store_gauge(app: Conveyor) -> None:
    app.enable_metrics()

    @app.task(name="noop")
    def noop() -> None:
        return None

    parent = noop.enqueue()
    noop.options(after=[parent]).enqueue()
    noop.options(after=[parent]).enqueue()
    data = samples(app)
    assert value(data, "conveyor_queue_jobs", queue="default", state="waiting") == 2
    assert value(data, "conveyor_queue_depth", queue="default") == 1


def test_store_gauges_follow_injected_time(app: Conveyor) -> None:
    """Oldest-job age is the store's view: a job due 30 s ago is 30 s old."""
    from conveyor.metrics import StoreCollector

    @app.task(name="t")
    def t() -> None: ...

    job = t.enqueue()
    backend = app.backend
    real_stats = backend.stats

    def stats_later(**kw: object) -> object:
        return real_stats(now=job.run_at + 30, **kw)  # type: ignore[arg-type]

    backend.stats = stats_later  # type: ignore[method-assign]
    try:
        families = {f.name: f for f in StoreCollector(backend).collect()}
    finally:
        backend.stats = real_stats  # type: ignore[method-assign]
    [age] = [s for s in families["conveyor_queue_oldest_job_age_seconds"].samples if s.labels["queue"] == "default"]
    assert age.value == pytest.approx(30, abs=0.01)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.process
def test_worker_process_serves_metrics_that_promtool_accepts(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "mapp.py").write_text(
        "from conveyor import Conveyor\n"
        "app = Conveyor()\n"
        "@app.task(name='work')\n"
        "def work(n: int) -> int:\n"
        "    if n < 0:\n"
        "        raise ValueError('negative')\n"
        "    return n\n"
    )
    port = _free_port()
    env = {**os.environ, "CONVEYOR_URL": store_url, "PYTHONPATH": str(app_dir)}
    monkeypatch.setenv("CONVEYOR_URL", store_url)  # the app module below reads it at import
    producer = Conveyor(store_url)
    sys.path.insert(0, str(app_dir))
    try:
        import mapp

        assert mapp.app.url == store_url
        ids = [mapp.work.enqueue(i).id for i in range(3)]
        failing = mapp.work.options(max_attempts=1).enqueue(-1).id
        mapp.app.close()
    finally:
        sys.path.remove(str(app_dir))
        sys.modules.pop("mapp", None)  # the next backend's run imports a fresh app
    log_path = tmp_path / "worker.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "conveyor", "--app", "mapp:app", "--log-format", "json", "worker",
             "--concurrency", "2", "--poll-interval", "0.1", "--metrics-port", str(port)],
            env=env, stderr=log, stdout=log,
        )
    try:
        for i in [*ids, failing]:
            wait_for_job(producer, i, timeout=20)

        def scrape() -> str | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text: str = r.read().decode()
            except OSError:
                return None
            return text if 'outcome="dead"' in text else None

        text = wait_until(scrape, timeout=15, message="metrics endpoint with the dead attempt")
        assert 'conveyor_job_attempts_total{outcome="succeeded",queue="default",task="work"} 3.0' in text
        assert 'conveyor_dead_jobs{queue="default"} 1.0' in text
        assert 'conveyor_workers_live{queue="default"} 1.0' in text
        promtool = shutil.which("promtool")
        if promtool is None and os.environ.get("CI") == "true":
            pytest.fail("promtool not found; .ci/run installs Debian's prometheus package")
        if promtool is not None:
            check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
            assert check.returncode == 0, check.stdout + check.stderr
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
        producer.close()
    # JSON logs: every line is an object, and the dead job's line names it.
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    assert lines, log_path.read_text()
    [dead] = [e for e in lines if e.get("outcome") == "dead"]
    assert dead["job_id"] == failing and dead["task"] == "work" and dead["queue"] == "default"
    assert dead["attempt"] == 1 and dead["level"] == "error"


def test_cancelling_a_running_job_counts_as_cancelled(make_app: Any) -> None:
    app = make_app(visibility_timeout=0.3)  # heartbeats every 0.1 s
    app.enable_metrics(store=False)
    started = threading.Event()

    @app.task(name="long")
    async def long() -> None:
        started.set()
        await asyncio.sleep(30)

    job = long.enqueue()
    with running_worker(app, concurrency=1):
        assert started.wait(10)
        assert app.backend.cancel(job.id)

        def counted() -> bool:
            return value(samples(app), "conveyor_job_attempts_total", queue="default", task="long",
                         outcome="cancelled") == 1

        wait_until(counted, timeout=10, message="the cancelled attempt to be counted")
    data = samples(app)
    assert value(data, "conveyor_leases_lost_total", queue="default") == 0
    assert app.get_job(job.id).state is JobState.CANCELLED
