"""Starting and running claimed jobs: a claimed job is admitted (started in a free slot, or held
for one), its attempt starts (early, on the thread its claim came back on, where it can), its
task runs, and its outcome goes to the completer."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, assert_never

from .. import faultpoints
from ..backends.base import Lease
from ..executor import Execution, Outcome, OutcomeKind
from ..hooks import JobHooks
from ..job import Job
from .capacity import Running, RunPhase
from .completer import log_job

if TYPE_CHECKING:
    from . import Worker

log = logging.getLogger("conveyor.worker")


class Runner:
    """Admits claimed jobs, starts their attempts and runs them to an outcome."""

    def __init__(self, w: Worker) -> None:
        self.w = w
        # Jobs whose attempt the claim's thread started (start_early), until admit takes them.
        self.started_early: dict[int, Execution] = {}

    def _execution(self, job: Job, hooked: bool | None = None) -> Execution:
        """``hooked``: whether the app has job hooks now (asked once per claim by start_early;
        None: ask here)."""
        w = self.w
        app = w.app
        if hooked is None:
            hooked = app.hooks.any_job_hooks()
        # Without job hooks, no events are built at all.
        hooks = JobHooks(app.hooks, app, w.id, w._loop) if hooked else None
        return Execution(job, app.tasks, w._pool, w.backend, app.signer, w._context,
                         max_result_bytes=app.max_result_bytes, hooks=hooks)

    def start_early(self, jobs: Sequence[Job], startable: int) -> None:
        """Where a claim came back (a store thread, the idle waiter's task thread, or the loop
        itself with Backend.loop_claims): start the first ``startable`` jobs' attempts (a sync
        task is handed to a thread: on the idle wait's task thread, the first of them to that
        very thread, which runs it when the wait returns), so a job does not wait for the loop
        to take the claim's reply (a thread hop). The loop then finishes starting them first
        thing (admit). A kill here is the same kill point as on the loop: the claim returned
        jobs."""
        if not jobs or startable <= 0:
            return
        faultpoints.hit("after_claim")
        hooked = self.w.app.hooks.any_job_hooks()
        for job in jobs[:startable]:
            if self.w.stopping:
                return  # the loop gives the rest back unrun
            execution = self._execution(job, hooked)
            try:
                # On a task thread (the idle wait's), the first sync task runs on it next.
                execution.prepare(here=True)
            except Exception:  # the loop's own start of the job meets it again and reports it
                log.exception("job %d: could not start it on the claim's thread", job.id)
                return
            self.started_early[job.id] = execution

    def admit(self, job: Job) -> None:
        """Take a claimed job in: heartbeated from now on, started in a free slot or held."""
        w = self.w
        assert job.lease_token is not None
        w.counters.claimed += 1
        running = Running(job=job, lease=Lease(job.id, job.lease_token))
        w.leases.jobs[job.id] = running  # heartbeated from now on, held or running
        running.execution = self.started_early.pop(job.id, None)
        if running.execution is not None:
            self.start(running)  # already started; Capacity.startable kept it within concurrency
        elif w.capacity.has_slot():
            self.start(running)
        else:
            w.capacity.hold(running)

    def start(self, running: Running) -> None:
        """Give a job a slot and run its task there."""
        w = self.w
        assert w._loop is not None
        w.capacity.busy += 1
        running.move(RunPhase.RUNNING)
        execution = running.execution
        if execution is not None and execution.on_thread:
            # Its sync task is on its thread already (start_early): what is left is to take
            # the outcome when the thread's future is done, which a callback does without a
            # Task per job (a Task, its coroutines and its two steps were a tenth of a short
            # job's cost in the worker).
            self._begin(running)
            # (made as a plain Future, its two fields set here: an __init__ of its own, calling
            # the C one through super(), doubled its cost)
            run = _SyncRun(loop=w._loop)
            run.runner, run.running = self, running
            running.task = run
            thread = execution.thread
            assert thread is not None
            thread.future.add_done_callback(run.returned)
        else:
            running.task = w._loop.create_task(self._run(running),
                                               name=f"conveyor-job-{running.job.id}")

    def _begin(self, running: Running) -> None:
        """As its attempt's wait begins: the log line, the pickup lag, the run's start time."""
        w = self.w
        job = running.job
        log_job(w, logging.DEBUG, job, "started", "job %d %s attempt %d/%d started",
                job.id, job.task, job.attempts, job.max_attempts)
        if w.metrics is not None and job.attempted_at is not None:
            w.metrics.lag_seconds.labels(job.queue).observe(max(0.0, job.attempted_at - job.run_at))
        running.started = time.perf_counter()

    async def _run(self, running: Running, outcome: Outcome | None = None,
                   slot_freed: bool = False) -> None:
        """The job's Task: runs its task and writes its outcome. Given ``outcome``, a _SyncRun's
        other than success (its thread ran the task; _finishing, whose answer is ``slot_freed``,
        and _timed are done), it only writes it: one wrapper for both paths, where a cancel
        while stopping or after a lost lease ends the run quietly."""
        execution = running.execution
        if execution is None:
            execution = self._execution(running.job)
            running.execution = execution
        if outcome is None:
            self._begin(running)
        try:
            if outcome is None:
                outcome = await execution.run()
                # True: its slot went back as the task finished, before the outcome landed.
                slot_freed = self._finishing(running, execution)
                self._timed(running)
                if outcome.kind is OutcomeKind.SUCCEEDED:
                    self._succeeded(running, outcome)
                    return
            await self._write(running, outcome)
        except asyncio.CancelledError:
            if not running.lost and not self.w.stopping:
                raise
        except Exception:
            log.exception("job %d: unexpected error in the worker", running.job.id)
        finally:
            self._end(running, execution, slot_freed)

    def _finishing(self, running: Running, execution: Execution) -> bool:
        """The task ended: only its outcome is left to write. True if its slot was freed here
        (its thread is done, or it had none)."""
        running.move(RunPhase.FINISHING)
        if execution.thread is None or execution.thread.done():
            # The slot is free for the next job while this one's outcome is written (the job
            # counts as done only once that write is durable).
            self.w.capacity.free_slot()
            return True
        return False

    def _timed(self, running: Running) -> None:
        w = self.w
        running.run_s = time.perf_counter() - running.started
        if w.metrics is not None:
            job = running.job
            w.metrics.run_seconds.labels(job.queue, job.task).observe(running.run_s)

    def _succeeded(self, running: Running, outcome: Outcome) -> None:
        # Its ack is queued; the ack's answer settles the job (it stays heartbeated until
        # then).
        faultpoints.hit("before_ack")
        self.w.completer.ack(running, outcome.result)

    async def _write(self, running: Running, outcome: Outcome) -> None:
        kind = outcome.kind
        if (kind is OutcomeKind.COMPLETED or kind is OutcomeKind.RETRY
                or kind is OutcomeKind.DEAD):
            await self.w.completer.write_outcome(running, outcome)
        elif kind is OutcomeKind.SUCCEEDED:
            raise AssertionError("a success is acked (Runner._succeeded), not written")
        else:
            assert_never(kind)
        # Before anything else runs: no heartbeat may count it lost now.
        running.move(RunPhase.SETTLED)

    def _end(self, running: Running, execution: Execution, slot_freed: bool) -> None:
        """The run is over (its outcome queued or written, or the run dropped)."""
        w = self.w
        job = running.job
        if not running.acking:
            w.completer.settle(running)
        thread = execution.thread
        if slot_freed:
            pass
        elif thread is not None and not thread.done():
            # A sync task can't be stopped (timeout, lost lease, shutdown): its slot stays
            # busy until the thread returns, so capacity shown is capacity real.
            log.warning("job %d: its thread is still running (%s); the slot stays busy "
                        "until it returns", job.id,
                        "lease lost" if running.lost else "timed out")
            w.capacity.stuck_changed(job.id, stuck=True)

            def returned(_: object, job_id: int = job.id) -> None:
                loop = w._loop
                if loop and not loop.is_closed():
                    loop.call_soon_threadsafe(w.capacity.unstuck, job_id)

            thread.add_done_callback(returned)
        else:
            w.capacity.free_slot()


class _SyncRun(asyncio.Future[None]):
    """``Running.task`` of a job whose sync task was started on its thread (Runner.start):
    what the job's asyncio Task is for the others. Done once the run is over: its success
    queued for its ack, its failure written, or the run dropped. ``cancel`` (Running.stop:
    a lost lease, the stop) drops it as cancelling that Task would: the worker stops waiting
    for the thread, and the job is settled, its slot held until the thread returns."""

    runner: Runner
    # The job's Running, whose ``task`` is this future: dropped once done, or the pair would be
    # a reference cycle holding each finished job's objects (its Execution, thread call,
    # context, Job) until the garbage collector's next pass.
    running: Running | None
    _rest: asyncio.Task[None] | None = None  # writing an outcome other than success

    def returned(self, _: asyncio.Future[Any]) -> None:
        """The thread's future is done (the task returned, or its timeout ran out)."""
        if self.done() or self._rest is not None:  # dropped meanwhile: nothing to take
            return
        runner, running = self.runner, self.running
        assert running is not None
        execution = running.execution
        assert execution is not None
        slot_freed = False
        try:
            outcome = execution.thread_outcome()
            slot_freed = runner._finishing(running, execution)
            runner._timed(running)
            if outcome.kind is not OutcomeKind.SUCCEEDED:
                loop = self.get_loop()
                self._rest = loop.create_task(
                    runner._run(running, outcome, slot_freed),
                    name=f"conveyor-job-{running.job.id}")
                self._rest.add_done_callback(self._rest_done)
                return
            runner._succeeded(running, outcome)
        except Exception:
            log.exception("job %d: unexpected error in the worker", running.job.id)
        runner._end(running, execution, slot_freed)
        self.set_result(None)
        self.running = None

    def _rest_done(self, rest: asyncio.Task[None]) -> None:
        if self.done():
            return
        if rest.cancelled():
            super().cancel()
        else:
            self.set_result(None)
        self.running = None

    def cancel(self, msg: Any = None) -> bool:
        if self.done():
            return False
        if self._rest is not None:  # writing its outcome: that write is cancelled
            return self._rest.cancel(msg)
        super().cancel(msg)
        running = self.running
        assert running is not None
        self.running = None
        execution = running.execution
        assert execution is not None and execution.thread is not None
        execution.thread.future.cancel()
        execution.dropped()
        # What follows a cancel, after it as with a Task (a cancel takes effect on its next
        # step): the job settled, its slot held until its thread returns.
        self.get_loop().call_soon(self.runner._end, running, execution, False)
        return True
