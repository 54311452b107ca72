"""A real Worker on a background thread against each backend: outcomes of jobs as stored.

Conditions are awaited by polling the store with a deadline, never by fixed sleeps."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from support import WorkerThread, claims_in_order, running_worker, wait_for_job, wait_until

from conveyor import Conveyor, JobState, Reject, Retry, RetryPolicy
from conveyor.backends.base import NewJob
from conveyor.executor import current_job


@pytest.fixture
def app(make_app: Callable[..., Conveyor]) -> Conveyor:
    """Quick retries (a few ms) so exhausting attempts takes no time."""
    return make_app(retry=RetryPolicy(base=0.01, cap=0.05))


def kinds(job: Any) -> list[str]:
    return [e["kind"] for e in job.errors]


@pytest.mark.needs("lookup")
def test_success_stores_the_result(app: Conveyor) -> None:
    @app.task(name="add")
    def add(a: int, b: int) -> dict[str, int]:
        return {"sum": a + b}

    @app.task(name="aadd")
    async def aadd(a: int, b: int) -> int:
        await asyncio.sleep(0)
        return a * b

    with running_worker(app):
        j1 = add.enqueue(2, 3)
        j2 = aadd.enqueue(4, 5)
        done1 = wait_for_job(app, j1.id)
        done2 = wait_for_job(app, j2.id)

    assert done1.state is JobState.SUCCEEDED
    assert done1.result == {"sum": 5}
    assert done1.attempts == 1
    assert done1.errors == []
    assert done1.finished_at is not None and done1.lease_token is None
    assert done2.state is JobState.SUCCEEDED
    assert done2.result == 20


@pytest.mark.needs("lookup")
def test_retry_with_delay_then_success(app: Conveyor) -> None:
    @app.task(name="flaky", max_attempts=5)
    def flaky() -> str:
        ctx = current_job()
        assert ctx is not None
        if ctx.attempt == 1:
            raise Retry(delay=0.05, reason="not yet")
        return f"done on attempt {ctx.attempt}"

    with running_worker(app):
        job = wait_for_job(app, flaky.enqueue().id)

    assert job.state is JobState.SUCCEEDED
    assert job.attempts == 2
    assert job.result == "done on attempt 2"
    [e] = job.errors
    assert (e["attempt"], e["kind"], e["message"]) == (1, "retry", "not yet")


@pytest.mark.needs("lookup")
def test_retry_on_the_last_attempt_goes_dead(app: Conveyor) -> None:
    @app.task(name="always_retry", max_attempts=2)
    def always_retry() -> None:
        raise Retry(delay=0)

    with running_worker(app):
        job = wait_for_job(app, always_retry.enqueue().id)

    assert job.state is JobState.DEAD
    assert job.attempts == 2
    assert kinds(job) == ["retry", "retry"]


@pytest.mark.needs("lookup")
def test_reject_goes_dead_after_one_attempt(app: Conveyor) -> None:
    @app.task(name="rejecting", max_attempts=5)
    def rejecting(order_id: int) -> None:
        raise Reject(f"order {order_id} does not exist")

    with running_worker(app):
        job = wait_for_job(app, rejecting.enqueue(99).id)

    assert job.state is JobState.DEAD
    assert job.attempts == 1
    [e] = job.errors
    assert e["kind"] == "rejected"
    assert e["message"] == "order 99 does not exist"
    assert job.finished_at is not None


@pytest.mark.needs("lookup")
def test_exceptions_go_dead_after_exactly_max_attempts(app: Conveyor) -> None:
    calls: list[int] = []

    @app.task(name="broken", max_attempts=3)
    def broken() -> None:
        ctx = current_job()
        assert ctx is not None
        calls.append(ctx.attempt)
        raise ValueError(f"failure on attempt {ctx.attempt}")

    with running_worker(app):
        job = wait_for_job(app, broken.enqueue().id)

    assert job.state is JobState.DEAD
    assert job.attempts == 3
    assert calls == [1, 2, 3]
    assert [e["attempt"] for e in job.errors] == [1, 2, 3]
    assert kinds(job) == ["exception"] * 3
    assert [e["type"] for e in job.errors] == ["ValueError"] * 3
    assert [e["message"] for e in job.errors] == [f"failure on attempt {n}" for n in (1, 2, 3)]
    assert all("Traceback" in e["traceback"] and "broken" in e["traceback"] for e in job.errors)


@pytest.mark.needs("lookup")
def test_async_task_timeout_is_recorded_and_retried(app: Conveyor) -> None:
    cancelled: list[int] = []

    @app.task(name="slow_async", max_attempts=2, timeout=0.2)
    async def slow_async() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(1)
            raise

    with running_worker(app):
        job = wait_for_job(app, slow_async.enqueue().id)

    assert job.state is JobState.DEAD
    assert job.attempts == 2
    assert kinds(job) == ["timeout", "timeout"]
    assert "0.2" in job.errors[0]["message"]
    assert cancelled == [1, 1]  # the coroutine was actually stopped each time


@pytest.mark.needs("lookup")
def test_sync_task_timeout_is_recorded(app: Conveyor) -> None:
    release = threading.Event()

    @app.task(name="slow_sync", max_attempts=1, timeout=0.2)
    def slow_sync() -> str:
        release.wait(10)
        return "too late"

    try:
        with running_worker(app):
            job = wait_for_job(app, slow_sync.enqueue().id)
    finally:
        release.set()

    assert job.state is JobState.DEAD
    assert job.attempts == 1
    [e] = job.errors
    assert e["kind"] == "timeout"
    assert "timeout" in e["message"]
    assert job.result is None


@pytest.mark.needs("lookup")
def test_unknown_task_goes_dead_and_does_not_block_the_queue(app: Conveyor) -> None:
    @app.task(name="known")
    def known(n: int) -> int:
        return n

    [ghost] = app.backend.enqueue_many(
        [NewJob(task="no.such.task", queue="default", args="{}", max_attempts=5, timeout=10)]
    )
    good = [known.enqueue(i) for i in range(3)]

    with running_worker(app, concurrency=1):
        dead = wait_for_job(app, ghost.id)
        results = [wait_for_job(app, j.id) for j in good]

    assert dead.state is JobState.DEAD
    assert dead.attempts == 1
    [e] = dead.errors
    assert e["kind"] == "unknown_task"
    assert "no.such.task" in e["message"]
    assert [(j.state, j.result) for j in results] == [(JobState.SUCCEEDED, i) for i in range(3)]


@pytest.mark.parametrize(
    "stored_args", ['{"renamed": 1}', "{}", "[1, 2]"], ids=["unknown-name", "missing", "not-object"]
)
@pytest.mark.needs("lookup")
def test_stored_args_that_no_longer_fit_go_dead(app: Conveyor, stored_args: str) -> None:
    @app.task(name="strict")
    def strict(user_id: int) -> int:
        return user_id

    [res] = app.backend.enqueue_many(
        [NewJob(task="strict", queue="default", args=stored_args, max_attempts=5, timeout=10)]
    )
    ok = strict.enqueue(7)

    with running_worker(app):
        job = wait_for_job(app, res.id)
        fine = wait_for_job(app, ok.id)

    assert job.state is JobState.DEAD
    assert job.attempts == 1
    assert kinds(job) == ["bad_arguments"]
    assert fine.state is JobState.SUCCEEDED and fine.result == 7


@pytest.mark.parametrize(
    "value",
    [object(), float("nan"), {1: "int key"}, b"bytes"],
    ids=["object", "nan", "int-key", "bytes"],
)
@pytest.mark.needs("lookup")
def test_a_result_that_is_not_json_goes_dead(app: Conveyor, value: Any) -> None:
    @app.task(name="weird_result", max_attempts=5)
    def weird_result() -> Any:
        return value

    with running_worker(app):
        job = wait_for_job(app, weird_result.enqueue().id)

    assert job.state is JobState.DEAD
    assert job.attempts == 1
    assert kinds(job) == ["bad_result"]
    assert job.result is None


@pytest.mark.needs("lookup")
def test_current_job_inside_sync_and_async_tasks(app: Conveyor) -> None:
    assert current_job() is None  # outside a worker

    def info() -> dict[str, int]:
        ctx = current_job()
        assert ctx is not None
        if ctx.attempt == 1:
            raise Retry(delay=0)
        return {"id": ctx.id, "attempt": ctx.attempt}

    @app.task(name="who_sync")
    def who_sync() -> dict[str, int]:
        return info()

    @app.task(name="who_async")
    async def who_async() -> dict[str, int]:
        return info()

    with running_worker(app):
        s = wait_for_job(app, who_sync.enqueue().id)
        a = wait_for_job(app, who_async.enqueue().id)

    assert s.state is JobState.SUCCEEDED and s.result == {"id": s.id, "attempt": 2}
    assert a.state is JobState.SUCCEEDED and a.result == {"id": a.id, "attempt": 2}
    assert current_job() is None


@pytest.mark.needs("lookup")
def test_tasks_see_the_context_the_worker_was_started_in(app: Conveyor) -> None:
    """Jobs start on the thread their claim came back on (the store's or the waiter's), yet
    run in a copy of the context of the worker's loop, as every asyncio task does."""
    var: contextvars.ContextVar[str] = contextvars.ContextVar("test_probe", default="unset")

    @app.task(name="read_var")
    def read_var() -> str:
        return var.get()

    @app.task(name="read_var_async")
    async def read_var_async() -> str:
        return var.get()

    before = [read_var.enqueue(), read_var_async.enqueue()]  # taken by the first claim
    wt = WorkerThread(app)

    def run() -> None:
        var.set("set before run")
        wt.worker.run()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        done = [wait_for_job(app, j.id) for j in before]
        done += [wait_for_job(app, read_var.enqueue().id)]  # an idle worker's wake-up and claim
    finally:
        wt.stop()
        thread.join(20)
    assert [j.result for j in done] == ["set before run"] * 3


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.needs("lookup")
def test_a_stop_during_a_claim_gives_back_only_the_jobs_not_yet_started(app: Conveyor, when: str) -> None:
    """A claim's first jobs start where the claim came back (Runner.start_early: on a store
    thread, or on the loop with Backend.loop_claims). A stop that comes before they start
    gives every job of the claim back unrun; one that comes after lets the started ones
    finish (they are running jobs, and a graceful stop waits for those) and gives back the
    rest: no job runs twice, none is left leased."""
    ran: list[int] = []

    @app.task(name="note")
    def note(i: int) -> None:
        ran.append(i)

    jobs = [note.enqueue(i) for i in range(4)]
    wt = WorkerThread(app, concurrency=2, prefetch=2)
    worker = wt.worker
    real = worker.runner.start_early
    calls: list[int] = []

    def prepare(claimed: Any, startable: int) -> None:
        calls.append(len(claimed))
        if when == "after":
            real(claimed, startable)
        if len(calls) == 1:
            try:
                asyncio.get_running_loop()
            except RuntimeError:  # on a store thread: the loop takes the stop meanwhile
                wt.stop()
                wait_until(lambda: worker.stopping)
            else:  # on the loop, which runs the stop's callback only after this returns
                wt._stop_requested = True
                worker._request_stop()
        if when == "before":
            real(claimed, startable)

    worker.runner.start_early = prepare  # type: ignore[method-assign]
    wt.start()
    wt.join()

    assert calls[0] == 4  # concurrency + prefetch, of which 2 may start at once
    final = [app.get_job(j.id) for j in jobs]
    if when == "before":
        assert ran == []
        assert [j.state for j in final] == [JobState.AVAILABLE] * 4
        assert worker.counters.released == 4
    else:
        # The claim's first two started: a store's first two jobs, any two on a broker.
        assert len(ran) == len(set(ran)) == 2
        if claims_in_order(app.backend):
            assert sorted(ran) == [0, 1]
        started = [i in ran for i in range(4)]
        assert [j.state for j in final] == [JobState.SUCCEEDED if s else JobState.AVAILABLE
                                            for s in started]
        assert [j.attempts for j in final] == [1 if s else 0 for s in started]
        assert worker.counters.released == 2 and worker.counters.succeeded == 2
    assert all(j.lease_token is None for j in final)


@pytest.mark.needs("lookup")
def test_weighted_queues_are_all_served(app: Conveyor) -> None:
    @app.task(name="hi", queue="high")
    def hi(n: int) -> str:
        return f"high {n}"

    @app.task(name="lo", queue="low")
    def lo(n: int) -> str:
        return f"low {n}"

    @app.task(name="other", queue="unwatched")
    def other() -> None:
        pass

    highs = [hi.enqueue(i) for i in range(10)]
    lows = [lo.enqueue(i) for i in range(10)]
    ignored = other.enqueue()

    with running_worker(app, queues="high:3,low:1", concurrency=2):
        done = [wait_for_job(app, j.id) for j in highs + lows]
        assert app.get_job(ignored.id).state is JobState.AVAILABLE

    assert [j.result for j in done] == [f"high {i}" for i in range(10)] + [
        f"low {i}" for i in range(10)
    ]
    assert all(j.state is JobState.SUCCEEDED for j in done)
    assert app.get_job(ignored.id).state is JobState.AVAILABLE


@pytest.mark.needs("lookup")
def test_graceful_stop_finishes_the_running_job(app: Conveyor) -> None:
    started = threading.Event()

    @app.task(name="long_job")
    def long_job() -> str:
        started.set()
        time.sleep(0.5)  # the work in progress when the stop comes
        return "finished"

    job = long_job.enqueue()
    wt = WorkerThread(app, grace_period=10).start()
    try:
        assert started.wait(10)
        assert app.get_job(job.id).state is JobState.RUNNING
    finally:
        wt.stop()
        wt.join()

    done = app.get_job(job.id)
    assert done.state is JobState.SUCCEEDED
    assert done.result == "finished"
    assert done.attempts == 1
    assert wt.worker.counters.released == 0
    assert wt.worker.counters.succeeded == 1


@pytest.mark.needs("lookup")
def test_hurried_stop_releases_the_running_job(app: Conveyor) -> None:
    started = threading.Event()
    release = threading.Event()

    @app.task(name="stuck", max_attempts=1)
    def stuck() -> str:
        started.set()
        release.wait(10)
        return "never stored"

    job = stuck.enqueue()
    wt = WorkerThread(app).start()
    try:
        assert started.wait(10)
        wt.stop(graceful=False)
        wt.join()
    finally:
        release.set()

    back = app.get_job(job.id)
    assert back.state is JobState.AVAILABLE
    assert back.attempts == 0  # the released attempt does not count: it can still run once
    assert back.lease_token is None
    assert wt.worker.counters.released == 1


@pytest.mark.needs("lookup")
def test_heartbeat_keeps_a_long_job_leased(app: Conveyor) -> None:
    @app.task(name="longer_than_lease")
    def longer_than_lease() -> str:
        time.sleep(3.2)  # well past the lease below
        return "kept"

    # A 2 s lease, heartbeated every third of it: a 1 s lease left a loaded machine's
    # scheduler 0.64 s between two beats to stall in (it failed once, under a loaded run).
    with running_worker(app, visibility_timeout=2.0):
        job = wait_for_job(app, longer_than_lease.enqueue().id)

    assert job.state is JobState.SUCCEEDED
    assert job.result == "kept"
    assert job.attempts == 1
    assert job.errors == []


@pytest.mark.needs("cancel")
def test_cancelling_a_running_job_stops_it(app: Conveyor) -> None:
    started = threading.Event()
    stopped = threading.Event()

    @app.task(name="cancellable", timeout=30)
    async def cancellable() -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            stopped.set()
            raise
        return "not cancelled"

    job = cancellable.enqueue()
    with running_worker(app, visibility_timeout=0.6) as wt:
        assert started.wait(10)
        assert app.backend.cancel(job.id)
        assert stopped.wait(10), "the worker did not stop the cancelled job"
        wait_until(lambda: wt.worker.counters.by_task["cancellable:cancelled"] == 1,
                   message="the attempt counted as cancelled")
        assert wt.worker.counters.lease_lost == 0  # a cancel is not a lost lease

    done = app.get_job(job.id)
    assert done.state is JobState.CANCELLED
    assert done.result is None


@pytest.mark.needs("cancel")
def test_cancelling_a_running_sync_job_settles_it_and_its_slot_waits_for_the_thread(
        app: Conveyor) -> None:
    # A sync task started on its thread at the claim is waited for without a Task of its
    # own (runner._SyncRun): stopping that wait must do what cancelling the Task did.
    started, saw_cancel, release = threading.Event(), threading.Event(), threading.Event()

    @app.task(name="sync_cancellable", timeout=30)
    def sync_cancellable() -> str:
        started.set()
        ctx = current_job()
        assert ctx is not None
        deadline = time.monotonic() + 10
        while not ctx.cancelled and time.monotonic() < deadline:
            time.sleep(0.01)
        saw_cancel.set()
        release.wait(10)
        return "not stored"

    job = sync_cancellable.enqueue()
    with running_worker(app, visibility_timeout=0.6, concurrency=1) as wt:
        w = wt.worker
        assert started.wait(10)
        assert app.backend.cancel(job.id)
        assert saw_cancel.wait(10), "the task never saw current_job().cancelled"
        wait_until(lambda: w.counters.by_task["sync_cancellable:cancelled"] == 1,
                   message="the attempt counted as cancelled")
        wait_until(lambda: job.id not in w.leases.jobs, message="the job settled")
        assert w.capacity.stuck == [job.id]  # its thread runs on: its slot is not free
        assert w.capacity.busy == 1
        release.set()
        wait_until(lambda: w.capacity.busy == 0 and not w.capacity.stuck,
                   message="the slot freed once the thread returned")
        assert w.counters.succeeded == 0 and w.counters.lease_lost == 0

    done = app.get_job(job.id)
    assert done.state is JobState.CANCELLED
    assert done.result is None


@pytest.mark.needs("workers")
def test_worker_is_listed_while_running_and_removed_after(app: Conveyor) -> None:
    with running_worker(app, queues="a:2,b:1", concurrency=3) as wt:
        wid = wt.worker.id
        info = wait_until(
            lambda: next((w for w in app.backend.stats().workers if w.id == wid), None)
        )
        assert info.queues == ["a", "b"]
        assert info.concurrency == 3
    assert all(w.id != wid for w in app.backend.stats().workers)


@pytest.mark.needs("workers")
def test_a_heartbeat_in_flight_at_stop_does_not_bring_the_worker_row_back(app: Conveyor) -> None:
    """The heartbeat's record_worker runs on a thread of its own; one still in flight when the
    worker stops must land before the worker removes its row, not after (a ghost row made
    the next ``conveyor demo`` refuse to start: "in use by a running demo")."""
    backend = app.backend
    real = backend.record_worker
    in_flight = threading.Event()

    def slow_record(info: Any, **kw: Any) -> None:
        if info.last_seen == 0.0 and in_flight.is_set():
            time.sleep(0.4)  # a slow store: the stop comes in meanwhile
        real(info, **kw)

    backend.record_worker = slow_record  # type: ignore[method-assign]
    try:
        wt = WorkerThread(app, visibility_timeout=0.3).start()  # heartbeat every 0.1 s
        wid = wt.worker.id
        wait_until(lambda: any(w.id == wid for w in backend.stats().workers))
        in_flight.set()
        time.sleep(0.15)  # a heartbeat is inside slow_record now
        wt.stop()
        wt.join()
    finally:
        backend.record_worker = real  # type: ignore[method-assign]
    time.sleep(0.5)  # anything still in flight has landed
    assert all(w.id != wid for w in backend.stats().workers)


@pytest.mark.needs("lookup")
def test_result_round_trips_through_json(app: Conveyor) -> None:
    payload = {"list": [1, 2.5, "three", None, True], "nested": {"k": ["v"]}, "unicode": "ünï ✓"}

    @app.task(name="identity")
    def identity(x: Any) -> Any:
        return x

    with running_worker(app):
        job = wait_for_job(app, identity.enqueue(payload).id)

    assert job.state is JobState.SUCCEEDED
    assert job.result == payload
    assert json.loads(json.dumps(job.result)) == payload


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.needs("lookup")
def test_a_task_calling_sys_exit_fails_its_job_not_the_worker(app: Conveyor, kind: str) -> None:
    """Libraries call sys.exit() (argparse on bad input, for one). In a task that must be an
    ordinary failure of that job: the worker keeps running and the other jobs still complete."""
    if kind == "sync":

        @app.task(name="exits", max_attempts=1)
        def exits() -> None:
            sys.exit(3)
    else:

        @app.task(name="exits", max_attempts=1)
        async def exits() -> None:
            sys.exit(3)

    @app.task(name="fine")
    def fine(n: int) -> int:
        return n

    bad = exits.enqueue()
    good = [fine.enqueue(i) for i in range(3)]
    wt = WorkerThread(app, concurrency=1).start()
    try:

        def settled() -> bool:
            jobs = [app.get_job(j.id) for j in (bad, *good)]
            return all(j.is_final for j in jobs) or not wt.thread.is_alive()

        wait_until(settled, timeout=10)
        worker_survived = wt.thread.is_alive()
    finally:
        wt.stop()
        wt.thread.join(20)
        died_with = repr(wt.errors)
        # A dead worker leaves an asyncio Task holding the SystemExit. Collect it now: if the
        # garbage collector finalized it later, inside pytest's own ast.parse, its logged
        # traceback would re-enter ast.parse and trip CPython 3.11's non-reentrant AST state
        # ("AST constructor recursion depth mismatch"), crashing the whole pytest run.
        wt.errors.clear()
        gc.collect()

    assert worker_survived, f"the worker died: {died_with}"
    dead = app.get_job(bad.id)
    assert dead.state is JobState.DEAD
    assert dead.attempts == 1
    [e] = dead.errors
    assert "SystemExit" in f"{e['type']} {e['message']} {e['traceback']}"
    assert [(app.get_job(j.id).state, app.get_job(j.id).result) for j in good] == [
        (JobState.SUCCEEDED, i) for i in range(3)
    ]


def _job_id_of(o: Any) -> int | None:
    """The job id of an object a worker makes for each job (its Job, Running, _SyncRun,
    Execution, JobContext), or None for any other object."""
    kind = type(o).__name__
    if kind == "Job":
        return int(o.id)
    if kind == "_SyncRun":
        o = o.running
    if kind in ("Running", "_SyncRun", "Execution", "JobContext") and o is not None:
        return int(o.job.id)
    return None


@pytest.mark.needs("lookup")
@pytest.mark.parametrize("kind", ["sync", "async", "sync-retried", "async-retried",
                                  "sync-hooked", "async-hooked"])
def test_finished_jobs_are_freed_without_the_garbage_collector(app: Conveyor, kind: str) -> None:
    """Each job's objects are freed by reference counting the moment it is over. A cycle per
    job (a sync run's future and its Running naming each other; a thread call keeping the
    method of the Execution that holds it) left some 20 objects a job to the garbage
    collector: under a steady load its young collections ran several times as often, and its
    full passes, which stop the worker for tens of milliseconds, came every few seconds
    (docs/benchmarks.md)."""
    is_async, retried = kind.startswith("async"), kind.endswith("retried")
    seen: list[int] = []
    if kind.endswith("hooked"):  # job hooks wrap each attempt (JobHooks, their events)

        @app.on("job_started")
        def started(event: Any) -> None:
            seen.append(event.job.id)

        @app.on("job_succeeded")
        def succeeded(event: Any) -> None:
            seen.append(event.job.id)

    def body(n: int) -> int:
        ctx = current_job()
        assert ctx is not None
        if retried and ctx.attempt == 1:
            raise ValueError(f"attempt 1 of {n} fails")
        return n

    if is_async:
        @app.task(name="freed", max_attempts=2)
        async def freed(n: int) -> int:
            return body(n)
    else:
        @app.task(name="freed", max_attempts=2)
        def freed(n: int) -> int:
            return body(n)

    def garbage_of(ids: set[int]) -> dict[str, int]:
        """The collector's garbage that belongs to the jobs ``ids``, by type. (Only theirs:
        what an earlier test's stopped worker leaves, or the worker's own start, is not a
        job's.)"""
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            return dict(Counter(type(o).__name__ for o in gc.garbage if _job_id_of(o) in ids))
        finally:
            gc.set_debug(0)
            gc.garbage.clear()

    with running_worker(app):
        wait_for_job(app, freed.enqueue(-1).id)  # the worker is up
        gc.collect()
        gc.disable()
        try:
            ids = [freed.enqueue(i).id for i in range(20)]
            done = [wait_for_job(app, i) for i in ids]
            left = garbage_of(set(ids))
        finally:
            gc.enable()
    assert {j.state for j in done} == {JobState.SUCCEEDED}
    assert {j.attempts for j in done} == {2 if retried else 1}
    if kind.endswith("hooked"):
        assert Counter(seen) >= Counter({i: 2 for i in ids})  # started and succeeded, each
    assert left == {}
