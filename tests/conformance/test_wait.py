"""Waiting for a result on each backend: ``job.wait(timeout=...)`` and ``job.wait_async(...)``
return the finished Job (succeeded, dead or cancelled) or raise TimeoutError; a wait is woken
by the store when the job finishes, and refused inside a task.

Jobs are run by a real Worker on a background thread, or finished through the Backend by a
helper thread."""

from __future__ import annotations

import asyncio
import pickle
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support import running_worker

from conveyor import Conveyor, JobState, Reject, waiting
from conveyor.backends.types import Lease
from conveyor.errors import ConveyorError, WaitInTask


@pytest.fixture
def never_poll(app: Conveyor) -> Iterator[None]:
    """A wait that looks at the job only once, when it starts, unless the store wakes it: a
    wait that returns a job finished after it started was woken, not polled."""
    backend = app.backend
    before = backend.finish_poll
    backend.finish_poll = (600.0, 600.0)
    try:
        yield
    finally:
        backend.finish_poll = before


def finish_later(app: Conveyor, job_id: int, how: str, after: float = 0.3) -> threading.Thread:
    """Claim the job now and, ``after`` seconds later, ack it (or cancel it) from a thread."""
    backend = app.backend
    [claimed] = backend.claim("default", 1, worker_id="w-test", lease_s=60)
    assert claimed.id == job_id and claimed.lease_token is not None
    lease = Lease(claimed.id, claimed.lease_token)

    def finish() -> None:
        time.sleep(after)
        if how == "ack":
            backend.ack(lease, '"done"')
        else:
            assert backend.cancel(job_id)

    thread = threading.Thread(target=finish, daemon=True)
    thread.start()
    return thread


@pytest.mark.needs("lookup")
def test_wait_returns_the_succeeded_job_with_its_result(app: Conveyor) -> None:
    @app.task(name="add")
    def add(a: int, b: int) -> int:
        return a + b

    job = add.enqueue(2, 3)
    with running_worker(app):
        done = job.wait(timeout=20)
    assert (done.id, done.state, done.result, done.errors) == (job.id, JobState.SUCCEEDED, 5, [])
    assert done.is_final and done.finished_at is not None


@pytest.mark.needs("lookup")
def test_wait_returns_the_dead_job_with_its_errors(app: Conveyor) -> None:
    @app.task(name="doomed", max_attempts=3)
    def doomed() -> None:
        raise Reject("no such customer")

    job = doomed.enqueue()
    with running_worker(app):
        done = job.wait(timeout=20)
    assert done.state == JobState.DEAD and done.result is None
    [error] = done.errors
    assert "no such customer" in error["message"]


@pytest.mark.needs("lookup")
def test_wait_returns_the_cancelled_job(app: Conveyor) -> None:
    @app.task(name="later")
    def later() -> None: ...

    job = later.options(delay=3600).enqueue()
    threading.Timer(0.2, app.cancel, args=(job.id,)).start()
    done = job.wait(timeout=20)
    assert (done.id, done.state) == (job.id, JobState.CANCELLED)


@pytest.mark.needs("lookup")
def test_wait_times_out_with_a_timeout_error(app: Conveyor) -> None:
    @app.task(name="idle")
    def idle() -> None: ...

    job = idle.enqueue()
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=f"job {job.id}") as info:
        job.wait(timeout=0.3)
    assert time.monotonic() - started >= 0.3
    assert isinstance(info.value, ConveyorError)
    assert info.value.job.state == JobState.AVAILABLE  # the job as it was last seen
    with pytest.raises(TimeoutError):
        job.wait(timeout=0)


@pytest.mark.needs("cancel")
def test_wait_on_an_already_finished_job_returns_at_once(app: Conveyor) -> None:
    @app.task(name="quick")
    def quick() -> None: ...

    job = quick.enqueue()
    assert app.cancel(job.id)
    assert job.wait(timeout=0).state == JobState.CANCELLED
    fetched = app.get_job(job.id)
    assert fetched.wait(timeout=0).state == JobState.CANCELLED


@pytest.mark.needs("lookup")
def test_jobs_from_enqueue_many_and_aenqueue_can_wait(app: Conveyor) -> None:
    @app.task(name="noop")
    def noop(n: int) -> int:
        return n

    jobs = noop.enqueue_many([(1,), (2,)])
    job3 = asyncio.run(noop.aenqueue(3))
    with running_worker(app):
        assert [j.wait(timeout=20).result for j in (*jobs, job3)] == [1, 2, 3]


@pytest.mark.needs("lookup")
def test_wait_async_returns_the_finished_job_and_times_out(app: Conveyor) -> None:
    @app.task(name="mul")
    def mul(a: int, b: int) -> int:
        return a * b

    async def main() -> tuple[Any, Any]:
        job = await mul.aenqueue(6, 7)
        with pytest.raises(TimeoutError):
            await job.wait_async(timeout=0.2)
        with running_worker(app):
            return job, await job.wait_async(timeout=20)

    job, done = asyncio.run(main())
    assert (done.id, done.state, done.result) == (job.id, JobState.SUCCEEDED, 42)


@pytest.mark.needs("lookup")
def test_wait_is_woken_by_the_store_when_the_job_succeeds(app: Conveyor,
                                                          never_poll: None) -> None:
    @app.task(name="woken")
    def woken() -> None: ...

    job = woken.enqueue()
    thread = finish_later(app, job.id, "ack")
    done = job.wait(timeout=60)
    thread.join()
    assert (done.state, done.result) == (JobState.SUCCEEDED, "done")


@pytest.mark.needs("lookup")
def test_wait_is_woken_by_the_store_when_the_job_is_cancelled(app: Conveyor,
                                                              never_poll: None) -> None:
    @app.task(name="woken")
    def woken() -> None: ...

    job = woken.enqueue()
    thread = finish_later(app, job.id, "cancel")
    done = job.wait(timeout=60)
    thread.join()
    assert done.state == JobState.CANCELLED


@pytest.mark.needs("lookup")
def test_wait_is_woken_by_the_store_when_a_worker_kills_the_job(app: Conveyor,
                                                                never_poll: None) -> None:
    @app.task(name="dies", max_attempts=1)
    def dies() -> None:
        time.sleep(0.3)
        raise RuntimeError("boom")

    job = dies.enqueue()
    with running_worker(app):
        done = job.wait(timeout=60)
    assert done.state == JobState.DEAD


@pytest.mark.needs("lookup")
def test_wait_is_woken_by_the_store_when_a_worker_acks_the_job(app: Conveyor,
                                                               never_poll: None) -> None:
    @app.task(name="slow")
    def slow() -> str:
        time.sleep(0.3)
        return "ok"

    job = slow.enqueue()
    with running_worker(app):
        done = job.wait(timeout=60)
    assert (done.state, done.result) == (JobState.SUCCEEDED, "ok")


@pytest.mark.needs("lookup")
def test_wait_async_is_woken_by_the_store(app: Conveyor, never_poll: None,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # One store wait for the whole call: no slice ends early to look again.
    monkeypatch.setattr(waiting, "ASYNC_SLICE", 600.0)

    @app.task(name="woken")
    def woken() -> None: ...

    async def main() -> Any:
        job = await woken.aenqueue()
        thread = finish_later(app, job.id, "ack")
        done = await job.wait_async(timeout=60)
        thread.join()
        return done

    assert asyncio.run(main()).state == JobState.SUCCEEDED


@pytest.mark.needs("lookup")
def test_wait_inside_a_task_is_refused_unless_asked_for(app: Conveyor) -> None:
    seen: list[str] = []

    @app.task(name="child")
    def child() -> int:
        return 1

    @app.task(name="parent", max_attempts=1)
    def parent(allow: bool) -> int:
        job = child.enqueue()
        if not allow:
            try:
                job.wait(timeout=5)
            except WaitInTask as exc:
                seen.append(str(exc))
                return 0
        return job.wait(timeout=20, disable_sync_subtasks=False).result

    @app.task(name="aparent", max_attempts=1)
    async def aparent() -> str:
        job = await child.aenqueue()
        try:
            await job.wait_async(timeout=5)
        except WaitInTask as exc:
            return type(exc).__name__
        return "waited"

    with running_worker(app, concurrency=4):
        refused, allowed, async_refused = parent.enqueue(False), parent.enqueue(True), \
            aparent.enqueue()
        assert refused.wait(timeout=20).result == 0
        assert allowed.wait(timeout=20).result == 1
        assert async_refused.wait(timeout=20).result == "WaitInTask"
    [message] = seen
    assert "deadlock" in message and "disable_sync_subtasks=False" in message


def test_a_job_not_bound_to_an_app_says_how_to_wait(app: Conveyor) -> None:
    @app.task(name="plain")
    def plain() -> None: ...

    job = plain.enqueue()
    [claimed] = app.backend.claim("default", 1, worker_id="w", lease_s=60)
    with pytest.raises(ConveyorError, match=r"app\.get_job"):
        claimed.wait(timeout=0)
    assert claimed.id == job.id
    # A bound job pickles as the plain snapshot it is (the app stays behind).
    copy = pickle.loads(pickle.dumps(job))
    assert copy == job
    with pytest.raises(ConveyorError, match=r"app\.get_job"):
        copy.wait(timeout=0)
