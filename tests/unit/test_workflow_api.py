"""The workflow API above the store (issue 35): what ``task.s``, ``options(after=...)``,
``app.chain``, ``app.group`` and ``app.batch`` hand to ``Backend.enqueue_many``.

A spy store records every write, so these need no store that implements dependencies; the
conformance tests (tests/conformance/test_workflow_app.py) run the same API end to end."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import pytest

import conveyor
from conveyor import Conveyor, Job, JobState
from conveyor.backends.base import BatchInfo, EnqueueResult, NewBatch, NewJob
from conveyor.errors import ArgumentsError, ConfigurationError


class SpyStore:
    """Records each ``enqueue_many`` call; hands out ids from 1000 and reads written jobs back
    as waiting (a store would say the same of a job whose parents are unfinished)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[NewJob], list[NewBatch]]] = []
        self.written: dict[int, NewJob] = {}
        self.next_id = 1000

    def enqueue_many(self, jobs: Sequence[NewJob], *, now: float | None = None,
                     batches: Sequence[NewBatch] = ()) -> list[EnqueueResult]:
        self.calls.append((list(jobs), list(batches)))
        out = []
        for job in jobs:
            self.next_id += 1
            self.written[self.next_id] = job
            out.append(EnqueueResult(self.next_id, True, time.time(), uid="0" * 32))
        return out

    def get(self, job_id: int) -> Job | None:
        new = self.written.get(job_id)
        if new is None:
            return None
        return Job(id=job_id, task=new.task, queue=new.queue, args=json.loads(new.args),
                   state=JobState.WAITING, attempts=0, max_attempts=new.max_attempts,
                   priority=new.priority, run_at=0.0, timeout=new.timeout, created_at=0.0,
                   parents=tuple(sorted(new.after)), batch_id=new.batch_id,
                   callback_of=new.callback_of)

    def get_batch(self, batch_id: str) -> BatchInfo | None:
        return BatchInfo(batch_id, created_at=1.0, total=3) if batch_id == "known" else None

    def close(self) -> None:
        pass

    @property
    def last(self) -> tuple[list[NewJob], list[NewBatch]]:
        return self.calls[-1]


@pytest.fixture
def spy() -> SpyStore:
    return SpyStore()


@pytest.fixture
def app(spy: SpyStore) -> Conveyor:
    app = Conveyor("sqlite:///unused-spy.db")
    app._backend = spy  # type: ignore[assignment]
    return app


@pytest.fixture
def tasks(app: Conveyor) -> Any:
    class T:
        @staticmethod
        @app.task(name="fetch")
        def fetch(url: str, timeout: int = 10) -> str:
            return url

        @staticmethod
        @app.task(name="parse")
        def parse(text: str, strict: bool = False) -> int:
            return len(text)

        @staticmethod
        @app.task(name="total")
        def total(counts: list[int], label: str = "") -> int:
            return sum(counts)

        @staticmethod
        @app.task(name="report")
        def report(batch_id: str, note: str = "") -> str:
            return batch_id

        @staticmethod
        @app.task(name="cleanup")
        def cleanup() -> None:
            return None

    return T


def args_of(job: NewJob) -> dict[str, Any]:
    return json.loads(job.args)  # type: ignore[no-any-return]


# -- signatures -----------------------------------------------------------------------------


def test_a_signature_is_a_frozen_call_that_can_take_options_and_enqueue(
        app: Conveyor, spy: SpyStore, tasks: Any) -> None:
    sig = tasks.fetch.s("https://a", timeout=3)
    assert isinstance(sig, conveyor.Signature)
    assert (sig.task, sig.args, dict(sig.kwargs)) == (tasks.fetch, ("https://a",), {"timeout": 3})
    with pytest.raises(AttributeError):
        sig.args = ()  # frozen
    fast = sig.options(priority=-5, queue="urgent")
    assert sig.opts is None and fast.opts is not None and fast.opts.priority == -5
    job = fast.enqueue()
    [[written], _] = spy.last
    assert (written.task, written.queue, written.priority) == ("fetch", "urgent", -5)
    assert args_of(written) == {"url": "https://a", "timeout": 3}
    assert job.id == spy.next_id
    assert repr(sig) == "fetch.s('https://a', timeout=3)"


# -- after= -----------------------------------------------------------------------------------


def test_after_takes_jobs_and_ids(app: Conveyor, spy: SpyStore, tasks: Any) -> None:
    parent = tasks.fetch.enqueue("https://a")
    child = tasks.parse.options(after=[parent, 7], on_parent_failure="run").enqueue("x")
    [[written], _] = spy.last
    assert written.after == (parent.id, 7)
    assert written.after_refs == ()
    assert written.on_parent_failure == "run"
    assert child.state is JobState.WAITING  # read back: whether the parents finished is the store's
    lone = tasks.parse.options(after=parent).enqueue("y")
    assert spy.last[0][0].after == (parent.id,)
    assert spy.last[0][0].on_parent_failure == "cancel"
    assert lone.parents == (parent.id,)


def test_options_add_up(app: Conveyor, spy: SpyStore, tasks: Any) -> None:
    tasks.parse.options(delay=30).options(after=[5]).enqueue("x")
    [[written], _] = spy.last
    assert (written.delay, written.after) == (30, (5,))


@pytest.mark.parametrize("bad", ["sometimes", "", None.__class__.__name__])
def test_a_bad_on_parent_failure_is_refused_clearly(tasks: Any, bad: str) -> None:
    with pytest.raises(ConfigurationError, match=r"on_parent_failure must be 'cancel'.*'run'"):
        tasks.parse.options(after=[1], on_parent_failure=bad)


@pytest.mark.parametrize("bad", ["12", 0, -3, True, 1.5, object()])
def test_after_refuses_what_is_not_a_job(tasks: Any, bad: object) -> None:
    with pytest.raises(ConfigurationError, match="after= takes jobs, job ids"):
        tasks.parse.options(after=[bad])


def test_cron_refuses_after(app: Conveyor, tasks: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"cron.*after="):
        app.cron("* * * * *", after=[1])
    with pytest.raises(ConfigurationError, match=r"cron.*after="):
        app.schedule(tasks.cleanup, "* * * * *", after=[1])


# -- chains -----------------------------------------------------------------------------------


def test_a_chain_is_one_write_whose_steps_refer_to_the_one_before(
        app: Conveyor, spy: SpyStore, tasks: Any) -> None:
    jobs = app.chain(tasks.fetch.s("https://a"), tasks.parse.s("t"), tasks.cleanup.s())
    assert len(spy.calls) == 1
    written, batches = spy.last
    assert batches == []
    assert [j.task for j in written] == ["fetch", "parse", "cleanup"]
    assert [j.after_refs for j in written] == [(), (0,), (1,)]
    assert [j.on_parent_failure for j in written] == ["cancel"] * 3
    assert [j.state for j in jobs] == [JobState.AVAILABLE, JobState.WAITING, JobState.WAITING]
    assert jobs[1].parents == (jobs[0].id,) and jobs[2].parents == (jobs[1].id,)


def test_a_group_in_a_chain_runs_in_parallel_and_its_successor_waits_for_all(
        app: Conveyor, spy: SpyStore, tasks: Any) -> None:
    jobs = app.chain(tasks.fetch.s("https://a"),
                     app.group(tasks.parse.s("a"), tasks.parse.s("b"), tasks.parse.s("c")),
                     tasks.total.s([1]))
    written, _ = spy.last
    assert [j.after_refs for j in written] == [(), (0,), (0,), (0,), (1, 2, 3)]
    assert len(jobs) == 5 and jobs[-1].parents == tuple(j.id for j in jobs[1:4])


def test_a_chain_keeps_each_steps_options_and_its_first_steps_parents(
        app: Conveyor, spy: SpyStore, tasks: Any) -> None:
    app.chain(tasks.fetch.s("u").options(after=[42], queue="io"), tasks.parse.s("t"))
    written, _ = spy.last
    assert (written[0].after, written[0].queue) == ((42,), "io")
    assert (written[1].after, written[1].after_refs) == ((), (0,))


def test_a_chain_with_pass_result_leaves_the_first_parameter_open(
        app: Conveyor, spy: SpyStore, tasks: Any) -> None:
    app.chain(tasks.fetch.s("https://a"), tasks.parse.s(strict=True),
              app.group(tasks.parse.s(), tasks.parse.s()), tasks.total.s(label="n"),
              pass_result=True)
    written, _ = spy.last
    assert args_of(written[0]) == {"url": "https://a"}
    assert args_of(written[1]) == {"strict": True}
    assert args_of(written[2]) == {} and args_of(written[3]) == {}
    assert args_of(written[4]) == {"label": "n"}
    metas = [json.loads(j.meta).get("pass_result") for j in written]
    assert metas == [None, {"many": False}, {"many": False}, {"many": False}, {"many": True}]


def test_pass_result_refuses_a_step_that_gives_its_first_argument(
        app: Conveyor, spy: SpyStore, tasks: Any) -> None:
    with pytest.raises(ArgumentsError):
        app.chain(tasks.fetch.s("u"), tasks.parse.s("t", False, "extra"), pass_result=True)
    with pytest.raises(ConfigurationError, match="only parent"):
        app.chain(tasks.fetch.s("u"), tasks.parse.s().options(after=[3]), pass_result=True)
    assert spy.calls == []


def test_pass_result_needs_a_positional_first_parameter(app: Conveyor, spy: SpyStore,
                                                        tasks: Any) -> None:
    @app.task(name="kwonly")
    def kwonly(*, x: int) -> int:
        return x

    with pytest.raises(ConfigurationError, match="first parameter"):
        app.chain(tasks.fetch.s("u"), kwonly.s(), pass_result=True)


def test_bad_chains_are_refused(app: Conveyor, spy: SpyStore, tasks: Any) -> None:
    with pytest.raises(ConfigurationError, match="at least one step"):
        app.chain()
    with pytest.raises(ConfigurationError, match="signatures"):
        app.chain(tasks.fetch.s("u"), tasks.parse)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="at least one signature"):
        app.group()
    other = Conveyor("sqlite:///unused-other.db")
    elsewhere = other.task(name="elsewhere")(lambda: None)
    with pytest.raises(ConfigurationError, match="another app"):
        app.chain(tasks.fetch.s("u"), elsewhere.s())
    with pytest.raises(ArgumentsError):
        app.chain(tasks.fetch.s("u"), tasks.parse.s(nope=1))
    assert spy.calls == []


# -- batches ----------------------------------------------------------------------------------


def test_a_batch_is_written_once_at_the_end_of_its_block(app: Conveyor, spy: SpyStore,
                                                         tasks: Any) -> None:
    with app.batch(on_success=tasks.report.s(note="ok"), on_complete=tasks.cleanup.s()) as b:
        first = tasks.fetch.enqueue("https://a")
        more = tasks.fetch.enqueue_many([("https://b",), ("https://c",)])
        assert isinstance(first, conveyor.PendingJob) and not first.written
        with pytest.raises(ConfigurationError, match="written when the batch block ends"):
            _ = first.id
        assert spy.calls == []
    assert len(spy.calls) == 1
    written, batches = spy.last
    assert len(b.id) == 32 and int(b.id, 16) >= 0
    assert batches == [NewBatch(b.id)]
    members, (on_success, on_complete) = written[:3], written[3:]
    assert {m.batch_id for m in members} == {b.id}
    assert on_success.task == "report" and on_complete.task == "cleanup"
    assert (on_success.callback_of, on_complete.callback_of) == (b.id, b.id)
    assert (on_success.batch_id, on_complete.batch_id) == (None, None)
    assert on_success.after_refs == on_complete.after_refs == (0, 1, 2)
    assert (on_success.on_parent_failure, on_complete.on_parent_failure) == ("cancel", "run")
    # The callback's function takes batch_id: it is given the batch's id.
    assert args_of(on_success) == {"batch_id": b.id, "note": "ok"}
    assert [j.id for j in b.jobs] == [first.job.id, *(h.id for h in more)]
    assert b.on_success_job is not None and b.on_success_job.callback_of == b.id
    assert b.on_complete_job is not None and b.on_complete_job.id == b.on_success_job.id + 1


def test_inside_a_batch_after_names_a_pending_job_by_its_position(
        app: Conveyor, spy: SpyStore, tasks: Any) -> None:
    before = tasks.fetch.enqueue("https://z")
    with app.batch() as b:
        a = tasks.fetch.enqueue("https://a")
        tasks.parse.options(after=[a, before]).enqueue("t")
    written, _ = spy.last
    assert written[1].after_refs == (0,) and written[1].after == (before.id,)
    # After the block the handle is the stored job, and after= takes it as an id.
    tasks.parse.options(after=[a]).enqueue("u")
    assert spy.last[0][0].after == (a.id,)
    assert b.jobs[0].id == a.id


def test_a_chain_inside_a_batch_refers_to_positions_of_the_batch_write(
        app: Conveyor, spy: SpyStore, tasks: Any) -> None:
    with app.batch(on_complete=tasks.cleanup.s()) as b:
        tasks.fetch.enqueue("https://a")
        steps = app.chain(tasks.fetch.s("https://b"), tasks.parse.s("t"))
    written, _ = spy.last
    assert [j.after_refs for j in written] == [(), (), (1,), (0, 1, 2)]
    assert {j.batch_id for j in written[:3]} == {b.id}
    assert all(isinstance(s, conveyor.PendingJob) for s in steps)
    assert [s.id for s in steps] == [j.id for j in b.jobs[1:]]  # type: ignore[attr-defined]


def test_a_nested_batch_is_written_by_the_outer_one_as_its_member(
        app: Conveyor, spy: SpyStore, tasks: Any) -> None:
    with app.batch(on_success=tasks.report.s()) as outer:
        tasks.fetch.enqueue("https://a")
        with app.batch(on_success=tasks.report.s(), on_complete=tasks.cleanup.s()) as inner:
            tasks.fetch.enqueue("https://b")
            tasks.fetch.enqueue("https://c")
        assert spy.calls == []
        tasks.fetch.enqueue("https://d")
    assert len(spy.calls) == 1
    written, batches = spy.last
    assert batches == [NewBatch(outer.id), NewBatch(inner.id, outer.id)]
    # a, b, c, inner's two callbacks, d, outer's callback
    assert [j.batch_id for j in written] == [outer.id, inner.id, inner.id, outer.id, outer.id,
                                             outer.id, None]
    assert [j.callback_of for j in written] == [None] * 3 + [inner.id] * 2 + [None, outer.id]
    assert written[3].after_refs == written[4].after_refs == (1, 2)
    assert written[6].after_refs == (0, 1, 2, 3, 4, 5)
    assert len(inner.jobs) == 2 and len(outer.jobs) == 6


def test_an_exception_in_the_block_writes_nothing(app: Conveyor, spy: SpyStore,
                                                  tasks: Any) -> None:
    with pytest.raises(RuntimeError), app.batch(on_complete=tasks.cleanup.s()):
        handle = tasks.fetch.enqueue("https://a")
        raise RuntimeError("boom")
    assert spy.calls == []
    with pytest.raises(ConfigurationError, match="raised"):
        _ = handle.job
    # Nothing is left open: the next enqueue is written at once.
    assert isinstance(tasks.fetch.enqueue("https://b"), Job)
    assert len(spy.calls) == 1


def test_an_inner_block_that_raises_drops_only_its_own_jobs(app: Conveyor, spy: SpyStore,
                                                            tasks: Any) -> None:
    with app.batch() as outer:
        tasks.fetch.enqueue("https://a")
        with pytest.raises(RuntimeError), app.batch(on_complete=tasks.cleanup.s()):
            tasks.fetch.enqueue("https://b")
            raise RuntimeError("boom")
        tasks.fetch.enqueue("https://c")
    written, batches = spy.last
    assert [args_of(j)["url"] for j in written] == ["https://a", "https://c"]
    assert batches == [NewBatch(outer.id)]


def test_an_empty_batch_runs_its_callbacks_at_once(app: Conveyor, spy: SpyStore,
                                                   tasks: Any) -> None:
    with app.batch(on_complete=tasks.cleanup.s()) as b:
        pass
    written, batches = spy.last
    assert batches == [NewBatch(b.id)]
    assert [(j.callback_of, j.after_refs) for j in written] == [(b.id, ())]
    assert b.jobs == []
    with app.batch():
        pass
    assert len(spy.calls) == 1  # no members, no callbacks: nothing to write


def test_what_a_batch_refuses(app: Conveyor, spy: SpyStore, tasks: Any) -> None:
    with pytest.raises(ConfigurationError, match="signature"):
        app.batch(on_success=tasks.report)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="connection="), app.batch():
        tasks.fetch.options(connection=object()).enqueue("https://a")
    other = Conveyor("sqlite:///unused-other.db")
    elsewhere = other.task(name="elsewhere")(lambda: None)
    with pytest.raises(ConfigurationError, match="another app"), app.batch():
        elsewhere.enqueue()
    assert spy.calls == []


def test_get_batch_asks_the_store(app: Conveyor) -> None:
    info = app.get_batch("known")
    assert info is not None and info.total == 3
    assert app.get_batch("unknown") is None


def test_async_enqueues_join_the_block_and_other_threads_do_not(app: Conveyor, spy: SpyStore,
                                                                 tasks: Any) -> None:
    import asyncio
    import threading

    async def inside() -> list[Any]:
        one = await tasks.fetch.aenqueue("https://a")
        more = await tasks.fetch.aenqueue_many([("https://b",)])
        return [one, *more]

    with app.batch() as b:
        handles = asyncio.run(inside())
        elsewhere: list[Job] = []
        t = threading.Thread(target=lambda: elsewhere.append(tasks.fetch.enqueue("https://c")))
        t.start()
        t.join()
        assert len(spy.calls) == 1  # the other thread's job was written at once
    assert all(isinstance(h, conveyor.PendingJob) for h in handles)
    written, _ = spy.last
    assert [args_of(j)["url"] for j in written] == ["https://a", "https://b"]
    assert {j.batch_id for j in written} == {b.id}
    assert elsewhere[0].batch_id is None
