"""Helpers shared by the tests: polling with a deadline, a worker on a background thread,
building backend-level jobs, and forked children that report back. Importable as ``support`` (tests/ is on sys.path via conftest)."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from conveyor import Conveyor, Job
from conveyor.backends.base import Backend, NewJob
from conveyor.worker import Worker

T = TypeVar("T")

T0 = 1_700_000_000.0  # an injected "now" for backend tests: well in the past, a round number


def wait_until(
    predicate: Callable[[], T], timeout: float = 10, interval: float = 0.01, message: str = ""
) -> T:
    """Poll ``predicate`` until it returns something truthy and return that; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout}s: {message or predicate}")
        time.sleep(interval)


def wait_for_job(app: Conveyor, job_id: int, *states: str, timeout: float = 10) -> Job:
    """Wait until the job is in one of ``states`` (default: any final state) and return it."""

    def check() -> Job | None:
        job = app.get_job(job_id)
        if states:
            return job if str(job.state) in states else None
        return job if job.is_final else None

    try:
        return wait_until(check, timeout=timeout, interval=0.01)
    except AssertionError:
        job = app.get_job(job_id)
        raise AssertionError(
            f"job {job_id} did not reach {states or 'a final state'} within {timeout}s; "
            f"it is {job.state} after {job.attempts} attempt(s), errors={job.errors}"
        ) from None


def new_job(
    task: str = "t.task",
    queue: str = "default",
    args: dict[str, Any] | None = None,
    *,
    max_attempts: int = 3,
    timeout: float = 30.0,
    **kw: Any,
) -> NewJob:
    return NewJob(
        task=task,
        queue=queue,
        args=json.dumps(args or {}),
        max_attempts=max_attempts,
        timeout=timeout,
        **kw,
    )


def enqueue_one(backend: Backend, *, now: float = T0, **kw: Any) -> int:
    [res] = backend.enqueue_many([new_job(**kw)], now=now)
    assert res.created
    return res.id


def claims_in_order(backend: Backend) -> bool:
    """Whether ``backend`` hands jobs out in (priority, run_at, id) order (the stores). A
    message broker hands them out lane by lane, each only roughly in arrival order (capability
    ``ordering``): a message given back (a failed claim's, an idle app's consumer's) goes to
    the back of its lane, and SQS's standard queues promise no order at all. So which of a
    lane's jobs one claim takes, and in what order, is the broker's."""
    return "ordering" not in backend.missing


class WorkerThread:
    """A Worker running ``run()`` on a background thread. ``stop()`` is idempotent: a second
    ``Worker.stop()`` would mean "hurry" (release running jobs), which tests must ask for explicitly."""

    def __init__(self, app: Conveyor, **kwargs: Any) -> None:
        kwargs.setdefault("install_signal_handlers", False)
        kwargs.setdefault("concurrency", 4)
        kwargs.setdefault("poll_interval", 0.1)
        kwargs.setdefault("maintenance_interval", 0.05)
        kwargs.setdefault("grace_period", 10.0)
        self.worker = Worker(app, **kwargs)
        self.errors: list[BaseException] = []
        self._stop_requested = False
        self.thread = threading.Thread(target=self._target, name="test-worker", daemon=True)

    def _target(self) -> None:
        try:
            self.worker.run()
        except BaseException as exc:  # surfaced in the test thread by join()
            self.errors.append(exc)

    def start(self) -> WorkerThread:
        self.thread.start()
        return self

    def stop(self, *, graceful: bool = True) -> None:
        """Ask once; ``graceful=False`` releases running jobs instead of waiting for them."""
        if not self._stop_requested:
            self._stop_requested = True
            self.worker.stop(graceful=graceful)

    def join(self, timeout: float = 20) -> None:
        self.thread.join(timeout=timeout)
        assert not self.thread.is_alive(), f"worker did not stop within {timeout}s of stop()"
        if self.errors:
            raise AssertionError(f"worker.run() raised {self.errors[0]!r}") from self.errors[0]


@contextlib.contextmanager
def running_worker(app: Conveyor, **kwargs: Any) -> Iterator[WorkerThread]:
    """Run a Worker on a background thread for the duration of the block, then stop and join it."""
    wt = WorkerThread(app, **kwargs).start()
    try:
        yield wt
    finally:
        wt.stop()
        wt.join()


def forked(body: Callable[[], Any]) -> tuple[int, int]:
    """Fork a child that runs ``body``, writes its JSON result (or its error's traceback) to a
    pipe and leaves with ``os._exit``: it never returns into pytest. Returns (pid, read end)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            try:
                report: dict[str, Any] = {"result": body()}
            except BaseException:
                report = {"error": traceback.format_exc()}
            os.write(w, json.dumps(report).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    return pid, r


def collect(children: list[tuple[int, int]], within: float) -> list[Any]:
    """Every ``forked`` child's result, in order; a child's error fails the test with its
    traceback, and children that have not reported within ``within`` seconds are killed."""
    deadline = time.monotonic() + within
    chunks: dict[int, list[bytes]] = {r: [] for _, r in children}
    open_ends = set(chunks)
    try:
        while open_ends:
            ready, _, _ = select.select(list(open_ends), [], [], max(deadline - time.monotonic(), 0.0))
            if not ready:
                raise AssertionError(f"{len(open_ends)} child(ren) did not report within {within}s")
            for r in ready:
                data = os.read(r, 65536)
                if data:
                    chunks[r].append(data)
                else:
                    open_ends.discard(r)
    finally:
        for pid, r in children:
            if r in open_ends:
                os.kill(pid, signal.SIGKILL)
            os.close(r)
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid, _ in children]
    reports = [json.loads(b"".join(chunks[r]) or b"{}") for _, r in children]
    errors = [rep["error"] for rep in reports if "error" in rep]
    assert not errors, "a child failed:\n" + "\n".join(errors)
    assert codes == [0] * len(children)
    return [rep["result"] for rep in reports]
