"""What a companion store adds to a broker (``Conveyor(amqp_url, state=store_url)``): the job
records, so lookups, results, unique keys, cancellation, steps and cron work as on the stores,
while the broker dispatches."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from brokerkit import Broker, wait_for, with_state
from support import running_worker, wait_for_job

from conveyor import Conveyor, JobState, RetryPolicy, Unsupported
from conveyor.backends.base import NewJob
from conveyor.executor import current_job

pytestmark = with_state


@pytest.fixture
def app(broker: Broker) -> Iterator[Conveyor]:
    app = Conveyor(broker.url, state=broker.state, retry=RetryPolicy(base=0.01, cap=0.05))
    try:
        yield app
    finally:
        app.close()


def test_results_and_failures_are_kept(app: Conveyor) -> None:
    @app.task(name="add")
    def add(a: int, b: int) -> int:
        return a + b

    @app.task(name="broken", max_attempts=2)
    def broken() -> None:
        raise RuntimeError("always")

    with running_worker(app):
        ok = add.enqueue(2, 3)
        bad = broken.enqueue()
        done = wait_for_job(app, ok.id)
        dead = wait_for_job(app, bad.id, "dead")
    assert done.state is JobState.SUCCEEDED and done.result == 5 and done.attempts == 1
    assert dead.attempts == 2 and [e["kind"] for e in dead.errors] == ["exception"] * 2
    listed = app.backend.list_jobs(state=JobState.DEAD)
    assert [j.id for j in listed.jobs] == [bad.id]
    stats = {q.queue: q for q in app.backend.stats().queues}
    assert stats["default"].succeeded == 1 and stats["default"].dead == 1


def test_unique_keys_hold_across_the_broker(app: Conveyor) -> None:
    runs: list[int] = []

    @app.task(name="once")
    def once(n: int) -> None:
        runs.append(n)

    first = once.options(unique_key="k").enqueue(1)
    second = once.options(unique_key="k").enqueue(2)
    assert second.id == first.id
    with running_worker(app):
        wait_for_job(app, first.id)
        other = once.enqueue(3)
        wait_for_job(app, other.id)
    assert sorted(runs) == [1, 3]


def test_fair_keys_where_the_broker_groups_messages(app: Conveyor) -> None:
    """SQS FIFO groups by fair_key, so a companion store takes fair keys there (the store keeps
    the key, the broker does the sharing); elsewhere they are refused by name."""
    order: list[tuple[str, int]] = []

    @app.task(name="tenant")
    def tenant(who: str, n: int) -> None:
        order.append((who, n))

    if "fair" in app.backend.missing:
        with pytest.raises(Unsupported, match="share a queue fairly"):
            tenant.options(fair_key="a").enqueue("a", 0)
        return
    jobs = [tenant.options(fair_key=who).enqueue(who, n) for n in range(3) for who in "ab"]
    with running_worker(app, concurrency=1):
        done = [wait_for_job(app, j.id) for j in jobs]
    assert {j.fair_key for j in done} == {"a", "b"}
    assert [n for who, n in order if who == "a"] == [0, 1, 2]


def test_a_cancelled_job_is_dropped_when_its_message_comes(app: Conveyor) -> None:
    runs: list[int] = []

    @app.task(name="work")
    def work(n: int) -> None:
        runs.append(n)

    doomed = work.enqueue(1)
    assert app.backend.cancel(doomed.id)
    with running_worker(app):
        kept = work.enqueue(2)
        wait_for_job(app, kept.id)
    assert runs == [2]
    assert app.backend.get(doomed.id).state is JobState.CANCELLED  # type: ignore[union-attr]
    assert app.backend.stats().queues[0].available == 0


def test_a_duplicate_message_of_a_finished_job_does_not_run_it(app: Conveyor) -> None:
    runs: list[int] = []

    @app.task(name="work")
    def work(n: int) -> None:
        runs.append(n)

    with running_worker(app):
        job = work.enqueue(1)
        wait_for_job(app, job.id)
        # The broker lost the ack and hands the message out again (here: published twice).
        backend = app.backend
        assert backend.get(job.id) is not None
        publish = backend.transport.publish  # type: ignore[attr-defined]
        stored = backend.get(job.id)
        assert stored is not None
        again = backend._republish(stored)  # type: ignore[attr-defined]
        publish([again])
        marker = work.enqueue(2)
        wait_for_job(app, marker.id)
    assert runs == [1, 2]


def test_steps_are_recorded_once(app: Conveyor) -> None:
    calls: list[str] = []
    tries = {"n": 0}
    lock = threading.Lock()

    @app.task(name="pay", max_attempts=3)
    def pay() -> str:
        ctx = current_job()
        assert ctx is not None
        charge = ctx.once("charge", lambda: calls.append("charge") or "ch_1")
        with lock:
            tries["n"] += 1
            if tries["n"] == 1:
                raise ValueError("after the charge")
        return charge

    with running_worker(app):
        job = pay.enqueue()
        done = wait_for_job(app, job.id)
    assert done.result == "ch_1" and done.attempts == 2 and calls == ["charge"]
    assert done.steps == {"charge": "ch_1"}


def test_cron_ticks_are_taken_once(app: Conveyor) -> None:
    @app.cron("* * * * * *", name="every-second")
    def tick() -> None:
        pass

    with running_worker(app), running_worker(app):
        wait_for(lambda: len([j for j in app.backend.list_jobs(state=JobState.SUCCEEDED).jobs
                              if j.task.endswith("tick")]) >= 2, timeout=20)
    ticks = [j for j in app.backend.list_jobs(state=JobState.SUCCEEDED, limit=500).jobs]
    runs = [j.run_at for j in ticks]
    assert len(runs) == len(set(runs))  # two schedulers, one job per tick


def test_a_failed_publish_leaves_no_record_waiting(app: Conveyor,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    @app.task(name="work")
    def work(n: int) -> None:
        pass

    backend = app.backend

    def down(items: object) -> None:
        raise ConnectionError("broker down")

    monkeypatch.setattr(backend.transport, "publish", down)  # type: ignore[attr-defined]
    with pytest.raises(ConnectionError):
        work.enqueue(1)
    (record,) = backend.list_jobs().jobs
    assert record.state is JobState.CANCELLED


def test_what_needs_the_claim_to_choose_is_still_refused(app: Conveyor) -> None:
    backend = app.backend
    base = {"task": "t", "queue": "q", "args": "{}", "max_attempts": 1, "timeout": 1.0}
    grouped = "fair" in backend.transport.supports  # type: ignore[attr-defined]
    refused = [{"concurrency_key": "c", "concurrency_limit": 1}, {"after": (1,)}]
    for kw in refused if grouped else [{"fair_key": "a"}, *refused]:
        with pytest.raises(Unsupported):
            backend.enqueue_many([NewJob(**base, **kw)])  # type: ignore[arg-type]
    with pytest.raises(Unsupported):
        backend.pause_queue("q")
    # Fair sharing is there where the broker groups messages itself (SQS FIFO). The clock is
    # the broker's: a caller's now= cannot make a delay or a lease run out sooner,
    # nor can a delay be cut short (run_now); the broker's lanes set the order.
    assert backend.missing == {"limits", "pause", "dependencies", "clock", "run_now",
                               "ordering"} | (
        set() if grouped else {"fair"})


@pytest.mark.parametrize("how", ["retry", "release"])
def test_the_next_message_is_taken_only_after_the_record_moved_on(
        broker: Broker, how: str) -> None:
    """A retry or release publishes the job's next message; a worker may receive it at once.
    The record must already say the attempt ended, or that worker's take would find the job
    still running, fence the attempt that is ending and record a lost lease it never had."""
    from conveyor.backends import open_backend
    from conveyor.backends.base import ErrorInfo, Lease

    first = open_backend(broker.url, state=broker.state)
    second = open_backend(broker.url, state=broker.state)
    try:
        base = {"task": "t", "queue": "q", "args": "{}", "max_attempts": 3, "timeout": 30.0}
        first.enqueue_many([NewJob(**base)])  # type: ignore[arg-type]
        (job,) = wait_for(lambda: first.claim("q", 1, worker_id="w1", lease_s=30))  # type: ignore[misc]
        publish = first.transport.publish  # type: ignore[attr-defined]
        taken: list = []

        # On SQS FIFO the next message is in the job's own message group, which SQS holds
        # while the ending attempt's delivery is out: nobody can take it before the settle.
        grouped = "fair" in first.transport.supports  # type: ignore[attr-defined]

        def publish_then_deliver(items: object) -> None:
            publish(items)
            if grouped:
                assert second.claim("q", 1, worker_id="w2", lease_s=30) == []
            else:
                taken.extend(wait_for(lambda: second.claim("q", 1, worker_id="w2", lease_s=30)))  # type: ignore[arg-type]

        first.transport.publish = publish_then_deliver  # type: ignore[attr-defined]
        lease = Lease(job.id, job.lease_token or "")
        if how == "retry":
            assert first.retry(lease, ErrorInfo("exception", "boom"), delay=0) is not None
        else:
            assert first.release([lease]) == [job.id]
        if grouped:
            taken.extend(wait_for(lambda: second.claim("q", 1, worker_id="w2", lease_s=30)))  # type: ignore[arg-type]
        (again,) = taken
        kinds = [e["kind"] for e in again.errors]
        assert kinds == (["exception"] if how == "retry" else [])
        assert again.attempts == (2 if how == "retry" else 1)
    finally:
        first.close()
        second.close()
