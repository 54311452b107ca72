"""Workflows through the app and a real worker on each store (issue 35): after=, chains,
groups, pass_result, parent_results, batches and their callbacks, end to end.

The store's own rules are in test_workflow_store.py; what the app hands the store is in
tests/unit/test_workflow_api.py."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from support import running_worker

from conveyor import Conveyor, JobState, PendingJob, Reject, RetryPolicy, current_job
from conveyor.errors import UnknownParent


@pytest.fixture
def app(make_app: Callable[..., Conveyor]) -> Conveyor:
    return make_app(retry=RetryPolicy(base=0.01, cap=0.05))


@pytest.mark.needs("dependencies")
def test_a_job_after_another_waits_then_runs(app: Conveyor) -> None:
    go = threading.Event()

    @app.task(name="slow")
    def slow() -> str:
        go.wait(10)
        return "slow done"

    @app.task(name="then")
    def then() -> dict[str, Any]:
        ctx = current_job()
        assert ctx is not None
        return {str(k): v for k, v in ctx.parent_results().items()}

    with running_worker(app):
        parent = slow.enqueue()
        child = then.options(after=[parent]).enqueue()
        assert child.state is JobState.WAITING and child.parents == (parent.id,)
        assert app.get_job(child.id).state is JobState.WAITING
        go.set()
        done = child.wait(10)
    assert done.state is JobState.SUCCEEDED
    assert done.result == {str(parent.id): "slow done"}


@pytest.mark.needs("dependencies")
def test_an_unknown_parent_is_refused(app: Conveyor) -> None:
    @app.task(name="noop")
    def noop() -> None:
        return None

    with pytest.raises(UnknownParent):
        noop.options(after=[987_654_321]).enqueue()


@pytest.mark.needs("dependencies")
def test_a_dead_parent_cancels_or_runs_the_child(app: Conveyor) -> None:
    @app.task(name="fails", max_attempts=1)
    def fails() -> None:
        raise Reject("no")

    @app.task(name="noop")
    def noop() -> str:
        return "ran"

    with running_worker(app):
        parent = fails.enqueue()
        cancelled = noop.options(after=[parent]).enqueue()
        runs = noop.options(after=[parent], on_parent_failure="run").enqueue()
        assert cancelled.wait(10).state is JobState.CANCELLED
        assert runs.wait(10).state is JobState.SUCCEEDED
    err = app.get_job(cancelled.id).last_error
    assert err is not None and err["kind"] == "parent_failed"


@pytest.mark.needs("dependencies")
def test_a_chain_runs_in_order_and_the_last_job_gives_the_result(app: Conveyor) -> None:
    order: list[str] = []

    @app.task(name="step")
    def step(name: str) -> str:
        order.append(name)
        return name.upper()

    with running_worker(app):
        jobs = app.chain(step.s("a"), step.s("b"), step.s("c"))
        assert [j.state for j in jobs] == [JobState.AVAILABLE, JobState.WAITING,
                                           JobState.WAITING]
        assert jobs[-1].wait(10).result == "C"
    assert order == ["a", "b", "c"]


@pytest.mark.needs("dependencies")
def test_a_chain_with_a_group_and_pass_result(app: Conveyor) -> None:
    @app.task(name="numbers")
    def numbers(n: int) -> list[int]:
        return list(range(n))

    @app.task(name="scale")
    def scale(values: list[int], by: int) -> int:
        return sum(values) * by

    @app.task(name="total")
    def total(parts: list[int], label: str) -> str:
        return f"{label}={sum(parts)}"

    with running_worker(app):
        jobs = app.chain(numbers.s(4), app.group(scale.s(by=1), scale.s(by=10)),
                         total.s(label="sum"), pass_result=True)
        last = jobs[-1].wait(10)
    assert last.state is JobState.SUCCEEDED, last.errors
    assert last.result == "sum=66"  # (0+1+2+3) * 1 + (0+1+2+3) * 10


@pytest.mark.needs("dependencies")
def test_a_failed_step_cancels_the_rest_of_the_chain(app: Conveyor) -> None:
    @app.task(name="boom", max_attempts=1)
    def boom() -> None:
        raise RuntimeError("boom")

    @app.task(name="noop")
    def noop() -> None:
        return None

    with running_worker(app):
        jobs = app.chain(boom.s(), noop.s(), noop.s())
        assert jobs[-1].wait(10).state is JobState.CANCELLED
    assert [app.get_job(j.id).state for j in jobs] == [
        JobState.DEAD, JobState.CANCELLED, JobState.CANCELLED]


@pytest.mark.needs("dependencies")
def test_a_batch_runs_on_success_once_with_its_id(app: Conveyor) -> None:
    calls: list[tuple[str, str]] = []

    @app.task(name="thumb")
    def thumb(n: int) -> int:
        return n * n

    @app.task(name="report")
    def report(batch_id: str) -> dict[str, Any]:
        calls.append(("report", batch_id))
        ctx = current_job()
        assert ctx is not None and ctx.callback_of == batch_id
        return {"sum": sum(ctx.parent_results().values())}

    @app.task(name="cleanup")
    def cleanup() -> str:
        ctx = current_job()
        assert ctx is not None and ctx.callback_of is not None
        calls.append(("cleanup", ctx.callback_of))
        return "clean"

    with running_worker(app, concurrency=8):
        with app.batch(on_success=report.s(), on_complete=cleanup.s()) as b:
            handles = [thumb.enqueue(i) for i in range(20)]
            assert all(isinstance(h, PendingJob) for h in handles)
            assert app.get_batch(b.id) is None  # nothing written inside the block
        assert len(b.jobs) == 20 and {j.batch_id for j in b.jobs} == {b.id}
        assert b.on_success_job is not None and b.on_complete_job is not None
        ok = b.on_success_job.wait(10)
        done = b.on_complete_job.wait(10)
    assert ok.state is JobState.SUCCEEDED and ok.result == {"sum": sum(i * i for i in range(20))}
    assert done.result == "clean"
    assert sorted(calls) == [("cleanup", b.id), ("report", b.id)]
    info = app.get_batch(b.id)
    assert info is not None
    assert (info.total, info.succeeded, info.dead, info.is_finished) == (20, 20, 0, True)
    assert (info.on_success, info.on_complete) == (ok.id, done.id)


@pytest.mark.needs("dependencies")
def test_a_failed_member_cancels_on_success_and_runs_on_complete(app: Conveyor) -> None:
    @app.task(name="member", max_attempts=1)
    def member(fail: bool) -> str | None:
        if fail:
            raise Reject("bad member")
        ctx = current_job()
        assert ctx is not None
        return ctx.batch_id

    @app.task(name="noop")
    def noop() -> str:
        return "ran"

    with running_worker(app):
        with app.batch(on_success=noop.s(), on_complete=noop.s()) as b:
            good = member.enqueue(False)
            member.enqueue(True)
        assert b.on_complete_job is not None and b.on_success_job is not None
        assert good.wait(10).result == b.id
        assert b.on_complete_job.wait(10).state is JobState.SUCCEEDED
        assert b.on_success_job.wait(10).state is JobState.CANCELLED
    info = app.get_batch(b.id)
    assert info is not None and (info.succeeded, info.dead) == (1, 1)


@pytest.mark.needs("dependencies")
def test_a_nested_batch_and_a_chain_inside_a_batch(app: Conveyor) -> None:
    @app.task(name="step")
    def step(n: int) -> int:
        return n

    @app.task(name="noop")
    def noop() -> str:
        return "ran"

    with running_worker(app):
        with app.batch(on_success=noop.s()) as outer:
            first = step.enqueue(1)
            app.chain(step.s(2), step.s(3))
            with app.batch(on_complete=noop.s()) as inner:
                step.options(after=[first]).enqueue(4)
        assert outer.on_success_job is not None and inner.on_complete_job is not None
        assert outer.on_success_job.wait(10).state is JobState.SUCCEEDED
        assert inner.on_complete_job.wait(10).state is JobState.SUCCEEDED
    outer_info, inner_info = app.get_batch(outer.id), app.get_batch(inner.id)
    assert inner_info is not None and inner_info.parent_id == outer.id and inner_info.total == 1
    # 1, the chain's two, the inner member and the inner callback
    assert outer_info is not None and outer_info.total == 5 and outer_info.succeeded == 5


@pytest.mark.needs("dependencies")
def test_an_empty_batch_runs_its_callback_at_once(app: Conveyor) -> None:
    @app.task(name="noop")
    def noop(batch_id: str) -> str:
        return batch_id

    with running_worker(app):
        with app.batch(on_complete=noop.s()) as b:
            pass
        assert b.on_complete_job is not None
        assert b.on_complete_job.wait(10).result == b.id
    info = app.get_batch(b.id)
    assert info is not None and info.total == 0


@pytest.mark.needs("dependencies")
def test_a_batch_whose_block_raises_writes_nothing(app: Conveyor) -> None:
    @app.task(name="noop")
    def noop() -> None:
        return None

    with pytest.raises(RuntimeError), app.batch(on_complete=noop.s()) as b:
        noop.enqueue()
        raise RuntimeError("changed my mind")
    assert app.get_batch(b.id) is None
    assert app.backend.list_jobs(limit=10).jobs == []


@pytest.mark.needs("dependencies")
def test_a_waiting_job_is_listed_and_counted(app: Conveyor) -> None:
    @app.task(name="noop")
    def noop() -> None:
        return None

    parent = noop.enqueue()
    child = noop.options(after=[parent]).enqueue()
    waiting = app.backend.list_jobs(state=JobState.WAITING).jobs
    assert [j.id for j in waiting] == [child.id]
    [q] = app.backend.stats().queues
    assert (q.waiting, q.available) == (1, 1)


@pytest.mark.needs("dependencies")
def test_pass_result_on_a_signed_app(make_app: Callable[..., Conveyor]) -> None:
    """The stored arguments leave the first parameter out and are signed so; the worker checks
    the signature before it fills that parameter with the parent's result."""
    app = make_app(signing_key="k" * 32)

    @app.task(name="start")
    def start() -> int:
        return 20

    @app.task(name="add")
    def add(value: int, more: int) -> int:
        return value + more

    with running_worker(app):
        jobs = app.chain(start.s(), add.s(more=1), add.s(more=2), pass_result=True)
        last = jobs[-1].wait(10)
    assert last.state is JobState.SUCCEEDED, last.errors
    assert last.result == 23
