"""conveyor.testing.drain: every available job run in-process by the real worker, on each store
(the ``app`` fixture is parametrized over the conformance suite's backends)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from conveyor import Conveyor, JobState, RetryPolicy, current_job
from conveyor.testing import DrainTimeout, JobFailed, adrain, drain


@pytest.fixture
def app(make_app: Callable[..., Conveyor]) -> Conveyor:
    # No jitter: full jitter can draw a backoff of a few ms, due before drain stops (a second
    # attempt in the test of a job left waiting for its retry: seen once in CI on Redis).
    return make_app(retry=RetryPolicy(base=2.0, factor=2.0, cap=30.0, jitter=False))


def test_runs_every_job_and_returns_the_finished_records(app: Conveyor) -> None:
    @app.task(name="add")
    def add(a: int, b: int) -> int:
        return a + b

    @app.task(name="mul")
    async def mul(a: int, b: int) -> int:
        await asyncio.sleep(0)
        return a * b

    jobs = [add.enqueue(1, 2), mul.enqueue(3, 4), add.enqueue(5, 6)]
    ran = drain(app)
    assert sorted(j.id for j in ran) == sorted(j.id for j in jobs)
    by_id = {j.id: j for j in ran}
    assert [by_id[j.id].result for j in jobs] == [3, 12, 11]
    assert all(j.state is JobState.SUCCEEDED for j in ran)
    assert drain(app) == []  # nothing left


def test_jobs_enqueued_by_tasks_run_too(app: Conveyor) -> None:
    @app.task(name="leaf")
    def leaf(n: int) -> int:
        return n * 10

    @app.task(name="fan_out")
    def fan_out(n: int) -> int:
        for i in range(n):
            leaf.enqueue(i)
        return n

    fan_out.enqueue(3)
    ran = drain(app)
    assert sorted(j.result for j in ran if j.task == "leaf") == [0, 10, 20]
    assert len(ran) == 4


def test_current_job_works_inside_tasks(app: Conveyor) -> None:
    @app.task(name="whoami")
    def whoami() -> list[int]:
        ctx = current_job()
        assert ctx is not None
        return [ctx.id, ctx.attempt]

    @app.task(name="awhoami")
    async def awhoami() -> int:
        ctx = current_job()
        assert ctx is not None
        return ctx.id

    a, b = whoami.enqueue(), awhoami.enqueue()
    done = {j.id: j for j in drain(app)}
    assert done[a.id].result == [a.id, 1]
    assert done[b.id].result == b.id


def test_a_failure_is_raised_with_the_job_and_the_original_error(app: Conveyor) -> None:
    @app.task(name="boom", max_attempts=1)
    def boom(x: int) -> None:
        raise ValueError(f"bad value {x}")

    job = boom.enqueue(7)
    with pytest.raises(JobFailed) as info:
        drain(app)
    err = info.value
    assert err.job.id == job.id
    assert err.job.state is JobState.DEAD
    assert err.error["type"] == "ValueError"
    assert err.error["message"] == "bad value 7"
    assert "bad value 7" in str(err) and "boom" in str(err)
    assert "raise ValueError" in str(err)  # the task's traceback is in the message


def test_failures_collected_when_not_raised(app: Conveyor) -> None:
    @app.task(name="ok")
    def ok() -> str:
        return "fine"

    @app.task(name="bad", max_attempts=1)
    def bad() -> None:
        raise RuntimeError("nope")

    ok.enqueue()
    failing = bad.enqueue()
    ran = drain(app, raise_failures=False)
    states = {j.id: j.state for j in ran}
    assert states[failing.id] is JobState.DEAD
    assert sorted(str(s) for s in states.values()) == ["dead", "succeeded"]
    dead = next(j for j in ran if j.id == failing.id)
    assert dead.last_error is not None and dead.last_error["message"] == "nope"


def test_a_job_left_waiting_for_its_retry_is_a_failure(app: Conveyor) -> None:
    """Without advancing time the retry's backoff (2 s here) is not due: the job ran and did
    not succeed, which a test must hear about."""

    @app.task(name="flaky")
    def flaky() -> None:
        raise ConnectionError("down")

    job = flaky.enqueue()
    with pytest.raises(JobFailed) as info:
        drain(app)
    assert info.value.job.id == job.id
    assert info.value.job.state is JobState.SCHEDULED
    assert app.get_job(job.id).attempts == 1


def test_advance_runs_retries_after_their_backoff(app: Conveyor) -> None:
    calls: list[int] = []

    @app.task(name="twice_then_ok", max_attempts=5)
    def twice_then_ok() -> str:
        ctx = current_job()
        assert ctx is not None
        calls.append(ctx.attempt)
        if ctx.attempt < 3:
            raise ConnectionError("not yet")
        return "ok"

    job = twice_then_ok.enqueue()
    ran = drain(app, advance=3600)
    assert calls == [1, 2, 3]
    [done] = ran
    assert done.id == job.id and done.state is JobState.SUCCEEDED and done.result == "ok"
    assert [e["attempt"] for e in done.errors] == [1, 2]


def test_advance_runs_scheduled_jobs_due_within_it(app: Conveyor) -> None:
    @app.task(name="later")
    def later(n: int) -> int:
        return n

    soon = later.options(delay=30).enqueue(1)
    far = later.options(delay=7200).enqueue(2)
    assert drain(app) == []  # nothing is due yet
    ran = drain(app, advance=60)
    assert [j.id for j in ran] == [soon.id]
    assert app.get_job(far.id).state is JobState.SCHEDULED
    assert [j.id for j in drain(app, advance=float("inf"))] == [far.id]


def test_only_the_queues_asked_for(app: Conveyor) -> None:
    @app.task(name="mail", queue="emails")
    def mail() -> None: ...

    @app.task(name="report", queue="reports")
    def report() -> None: ...

    m, r = mail.enqueue(), report.enqueue()
    assert [j.id for j in drain(app, queues=["emails"])] == [m.id]
    assert app.get_job(r.id).state is JobState.AVAILABLE
    # By default every queue the app's tasks use.
    assert [j.id for j in drain(app)] == [r.id]


def test_adrain_from_a_running_loop(app: Conveyor) -> None:
    @app.task(name="inc")
    async def inc(n: int) -> int:
        return n + 1

    async def main() -> list[int]:
        inc.enqueue(1)
        return [j.result for j in await adrain(app)]

    assert asyncio.run(main()) == [2]


def test_a_drain_that_never_ends_times_out(app: Conveyor) -> None:
    @app.task(name="forever")
    def forever() -> None:
        forever.enqueue()

    forever.enqueue()
    with pytest.raises(DrainTimeout):
        drain(app, timeout=0.5)
