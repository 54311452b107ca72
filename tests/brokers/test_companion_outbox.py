"""A companion writes a job's record before its message: a process that dies in between leaves
an outbox mark on the record, and a sweep (the workers' maintenance, one process at a time)
publishes the message again, so the job runs."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from brokerkit import Broker, with_state
from support import forked, running_worker, wait_for_job

from conveyor import Conveyor, JobState
from conveyor.backends.base import Backend, NewJob

pytestmark = with_state


def make_app(broker: Broker) -> Conveyor:
    return Conveyor(broker.url, state=broker.state)


@pytest.fixture
def app(broker: Broker) -> Iterator[Conveyor]:
    app = make_app(broker)
    try:
        yield app
    finally:
        app.close()


def test_a_job_whose_enqueue_died_before_the_publish_runs_after_the_sweep(
        broker: Broker) -> None:
    def enqueue_and_die() -> None:
        app = make_app(broker)

        @app.task(name="work")
        def work(n: int) -> None:
            pass

        def die(items: object) -> None:
            os._exit(3)  # the process ends between the record and its message

        app.backend.transport.publish = die  # type: ignore[attr-defined]
        work.enqueue(1)

    pid, r = forked(enqueue_and_die)
    _, status = os.waitpid(pid, 0)
    os.close(r)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3

    app = make_app(broker)
    runs: list[int] = []

    @app.task(name="work")
    def work(n: int) -> None:
        runs.append(n)

    try:
        (record,) = app.backend.list_jobs().jobs
        assert record.state is JobState.AVAILABLE  # written, and no message for it
        backend: Any = app.backend
        backend.outbox_after = 0.0  # the test's bound: any mark is old enough
        backend.outbox_every = 0.0
        with running_worker(app):
            done = wait_for_job(app, record.id, timeout=30)
        assert done.state is JobState.SUCCEEDED and runs == [1]
        assert backend.sweep_outbox() == 0  # confirmed: nothing left to publish
    finally:
        app.close()


def test_a_confirmed_enqueue_leaves_nothing_to_sweep(
        open_broker: Callable[[], Backend]) -> None:
    backend: Any = open_broker()
    backend.outbox_after = 0.0
    base = {"task": "t", "queue": "q", "args": "{}", "max_attempts": 3, "timeout": 30.0}
    backend.enqueue_many([NewJob(**base), NewJob(**base, delay=600)])  # type: ignore[arg-type]
    assert backend.sweep_outbox() == 0


def test_a_redrive_whose_publish_failed_runs_after_the_sweep(
        app: Conveyor, monkeypatch: pytest.MonkeyPatch) -> None:
    tries: list[int] = []

    @app.task(name="flaky", max_attempts=1)
    def flaky() -> str:
        tries.append(1)
        if len(tries) == 1:
            raise RuntimeError("first time")
        return "ok"

    job = flaky.enqueue()
    with running_worker(app):
        wait_for_job(app, job.id, "dead")
    backend: Any = app.backend
    publish = backend.transport.publish

    def down(items: object) -> None:
        raise ConnectionError("broker down")

    monkeypatch.setattr(backend.transport, "publish", down)
    with pytest.raises(ConnectionError):
        backend.redrive([job.id])
    monkeypatch.setattr(backend.transport, "publish", publish)
    assert app.backend.get(job.id).state is JobState.AVAILABLE  # type: ignore[union-attr]
    backend.outbox_after = 0.0
    assert backend.sweep_outbox() == 1
    with running_worker(app):
        done = wait_for_job(app, job.id, "succeeded", timeout=30)
    assert done.result == "ok" and len(tries) == 2


def test_one_sweep_publishes_every_due_message_past_marks_that_need_none(
        open_broker: Callable[[], Backend]) -> None:
    """A backlog of marks whose jobs moved on, mixed with jobs that still need their message:
    one sweep publishes all of the latter, batch after batch, not only the first batch's."""
    backend: Any = open_broker()
    backend.outbox_after = 0.0
    state = backend.state
    base = {"task": "t", "queue": "q", "args": "{}", "max_attempts": 3, "timeout": 30.0}
    n = backend.SWEEP_BATCH * 2 + 10
    made = state.enqueue_many([NewJob(**base) for _ in range(n)])  # type: ignore[arg-type]
    ids = [r.id for r in made]
    # Every other job moved on: cancelled (no message needed); the others still wait.
    cancelled = ids[::2]
    for i in cancelled:
        assert state.cancel(i)
    state.outbox_mark(ids)
    published: list[int] = []
    publish = backend.transport.publish

    def counting(items: list[Any]) -> Any:
        published.append(len(items))
        return publish(items)

    backend.transport.publish = counting
    assert backend.sweep_outbox() == n - len(cancelled)
    assert sum(published) == n - len(cancelled)
    assert backend.sweep_outbox() == 0
    assert state.outbox_sweep(older_than=0.0, now=time.time() + 3600) == []  # nothing left
