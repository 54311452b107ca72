"""Stuck slots: a sync task that outlives its timeout keeps its thread, and so its slot. They are
counted in the worker's heartbeat (``WorkerInfo.stuck``), in a metric and by an alert, and a
stuck slot is never handed out as a free one.

Conditions are awaited by polling the store with a deadline, never by fixed sleeps."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from support import WorkerThread, running_worker, wait_for_job, wait_until

from conveyor import Conveyor, JobState
from conveyor.alerts import Alerting, Incident, StuckSlots
from conveyor.backends.base import Backend, WorkerInfo
from conveyor.cli import cli
from conveyor.metrics import Metrics
from conveyor.worker import EXIT_STUCK


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """What the hung tasks wait for; set at the end whatever happens, so their threads finish."""
    event = threading.Event()
    try:
        yield event
    finally:
        event.set()


@pytest.mark.needs("workers")
def test_record_worker_keeps_the_stuck_count(backend: Backend, store_url: str,
                                             store_state: str | None) -> None:
    info = WorkerInfo(id="w1", queues=["default"], concurrency=2, host="h", pid=1, started_at=1.0,
                      last_seen=0.0, running=0, stuck=2)
    backend.record_worker(info)
    [seen] = backend.stats().workers
    assert (seen.running, seen.stuck) == (0, 2)
    url = ["--url", store_url, *(["--state-url", store_state] if store_state else [])]
    shown = CliRunner().invoke(cli, [*url, "stats", "--json"])
    assert shown.exit_code == 0, shown.output
    [row] = json.loads(shown.output)["workers"]
    assert (row["running"], row["stuck"]) == (0, 2)
    table = CliRunner().invoke(cli, [*url, "stats"], env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    assert re.search(r"┃ running ┃ stuck ┃ concurrency ┃", table.output), table.output
    assert re.search(r"│ w1 +│ default +│ 0 +│ 2 +│ 2 +│", table.output), table.output
    backend.record_worker(WorkerInfo(id="w1", queues=["default"], concurrency=2, host="h", pid=1,
                                     started_at=1.0, last_seen=0.0, running=1))
    [seen] = backend.stats().workers
    assert (seen.running, seen.stuck) == (1, 0)


@pytest.mark.needs("lookup")
def test_two_hung_sync_tasks_are_two_stuck_slots(app: Conveyor, gate: threading.Event) -> None:
    @app.task(name="hang", timeout=0.2, max_attempts=1)
    def hang() -> None:
        gate.wait(120)

    @app.task(name="quick")
    def quick() -> str:
        return "done"

    metrics = Metrics()
    notified: list[str] = []

    def notify(incident: Incident) -> None:
        notified.append(incident.status)

    alerting = Alerting(app.backend, [StuckSlots()], [notify])

    with running_worker(app, concurrency=2, visibility_timeout=0.6, metrics=metrics) as wt:
        hung = [hang.enqueue(), hang.enqueue()]
        for job in hung:  # the timeout settled them: they are no longer "running" in the store
            assert wait_for_job(app, job.id).state is JobState.DEAD

        def me() -> WorkerInfo | None:
            return next((w for w in app.backend.stats().workers if w.id == wt.worker.id), None)

        stuck = wait_until(lambda: (w := me()) is not None and w.stuck == 2 and w, message="stuck 2 in stats")
        assert isinstance(stuck, WorkerInfo) and stuck.running == 0
        assert metrics.registry.get_sample_value("conveyor_worker_stuck_slots") == 2

        [fired] = alerting.evaluate()
        assert fired.key == f"stuck_slots:{wt.worker.id}" and fired.value == 2 and fired.status == "firing"
        assert alerting.evaluate() == []  # one notification per incident

        # Both slots are held by hung threads: a waiting job is not claimed, however many
        # heartbeats (each one a round of the worker's loops) go by.
        waiting = quick.enqueue()
        def beat_after(seen: float) -> float:
            return wait_until(lambda: (w := me()) is not None and w.last_seen > seen and w.last_seen,
                              message="a heartbeat")

        seen = stuck.last_seen
        for _ in range(3):
            seen = beat_after(seen)
        assert app.get_job(waiting.id).state is JobState.AVAILABLE
        assert wt.worker.counters.claimed == 2

        gate.set()  # the threads return: the slots are free again
        assert wait_for_job(app, waiting.id).state is JobState.SUCCEEDED
        wait_until(lambda: (w := me()) is not None and w.stuck == 0, message="stuck 0 in stats")
        assert metrics.registry.get_sample_value("conveyor_worker_stuck_slots") == 0
        [resolved] = alerting.evaluate()
        assert resolved.key == fired.key and resolved.status == "resolved"
    assert notified == ["firing", "resolved"]


@pytest.mark.needs("lookup")
def test_a_worker_with_every_slot_stuck_stops_and_gives_back_only_what_it_holds(
        app: Conveyor, gate: threading.Event) -> None:
    @app.task(name="hang", timeout=0.2, max_attempts=2, priority=-1)  # claimed first
    def hang() -> None:
        gate.wait(120)

    @app.task(name="quick")
    def quick() -> str:
        return "done"

    hung = hang.enqueue()
    waiting = quick.enqueue()
    metrics = Metrics()
    # One slot, one job prefetched: the hung job takes the slot, the quick one is held behind it.
    wt = WorkerThread(app, concurrency=1, prefetch=1, prefetch_hold=60, stuck_grace=0.3, metrics=metrics).start()
    try:
        wait_until(lambda: not wt.thread.is_alive(), timeout=30, message="the worker to stop by itself")
    finally:
        wt.stop()
        wt.join()
    assert wt.worker.exit_code == EXIT_STUCK
    # The hung job was settled by its timeout (a retry), not released by the stop: one attempt
    # spent, with its timeout error. The held job went back unrun, its attempt not counted.
    again = app.get_job(hung.id)
    assert again.state in (JobState.SCHEDULED, JobState.AVAILABLE) and again.attempts == 1
    assert [e["kind"] for e in again.errors] == ["timeout"]
    back = app.get_job(waiting.id)
    assert back.state is JobState.AVAILABLE and back.attempts == 0
    assert wt.worker.counters.released == 1
    assert metrics.registry.get_sample_value("conveyor_worker_stuck_slots") == 0  # that worker is gone
