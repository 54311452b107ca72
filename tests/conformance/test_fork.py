"""Fork safety, on every backend: an app used before ``os.fork()`` (gunicorn ``--preload``,
multiprocessing with the fork start method) keeps working in the parent and in every child.

A child inherits the parent's connections: PostgreSQL pool and LISTEN sockets, Redis sockets,
SQLite connections (which SQLite forbids across a fork). Talking on them from two processes
mixes the two conversations (protocol errors, jobs written twice or reported lost), and closing
them in the child would end the parent's sessions. Each process must make its own, and leave
the parent's alone.

Children report through a pipe and leave with ``os._exit``: they never run pytest's teardown.
"""

from __future__ import annotations

import json
import os
import select
import signal
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from conveyor import Conveyor, JobState, Task
from conveyor.worker import Worker

CHILDREN = 4
PER_PROCESS = 25
REPORT_WITHIN_S = 30.0  # only a hung child takes this long; it is killed then


def _forked(body: Callable[[], Any]) -> tuple[int, int]:
    """Fork a child that runs ``body``, writes its JSON result (or its error) to a pipe and
    leaves with ``os._exit``. Returns (pid, read end)."""
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


def _collect(children: list[tuple[int, int]]) -> list[Any]:
    """Every child's result, in order; a child's error fails the test with its traceback."""
    deadline = time.monotonic() + REPORT_WITHIN_S
    chunks: dict[int, list[bytes]] = {r: [] for _, r in children}
    open_ends = set(chunks)
    try:
        while open_ends:
            left = deadline - time.monotonic()
            ready, _, _ = select.select(list(open_ends), [], [], max(left, 0.0))
            if not ready:
                raise AssertionError(f"{len(open_ends)} child(ren) did not report within {REPORT_WITHIN_S}s")
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


def _use_everything(app: Conveyor) -> None:
    """Open what an app in use holds: pooled connections, and a waiting worker's (LISTEN on
    PostgreSQL, the blocking pop's on Redis)."""
    app.backend.wait_for_jobs(["fork-nothing"], 0.01)


def test_forked_children_and_parent_enqueue_at_once(app: Conveyor) -> None:
    note: Task[..., Any] = app.task(name="fork.note")(lambda who, n: None)
    first = note.enqueue("parent", -1).id
    _use_everything(app)
    # Other threads of the parent are inside calls while it forks: one enqueues, one waits idle
    # as a worker does. Whatever they hold (a write lock, the LISTEN connection) is theirs; a
    # child must not wait for it, nor use it.
    stop = threading.Event()
    produced: list[int] = []

    def produce() -> None:
        while not stop.is_set():
            produced.append(note.enqueue("producer", len(produced)).id)

    def idle() -> None:
        while not stop.is_set():
            app.backend.wait_for_jobs(["fork-idle"], 0.05)

    threads = [threading.Thread(target=produce), threading.Thread(target=idle)]
    for t in threads:
        t.start()

    def child() -> list[int]:
        app.backend.wait_for_jobs(["fork-idle"], 0.01)
        return [note.enqueue(os.getpid(), n).id for n in range(PER_PROCESS)]

    try:
        children = [_forked(child) for _ in range(CHILDREN)]
        mine = [note.enqueue("parent", n).id for n in range(PER_PROCESS)]
        reported = [i for ids in _collect(children) for i in ids]
    finally:
        stop.set()
        for t in threads:
            t.join()

    every = [first, *mine, *produced, *reported]
    assert len(set(every)) == len(every) == 1 + (CHILDREN + 1) * PER_PROCESS + len(produced)
    page = app.backend.list_jobs(limit=100_000)
    assert sorted(j.id for j in page.jobs) == sorted(every)
    # The children did not end or disturb the parent's sessions: its connections still answer.
    assert app.get_job(note.enqueue("parent", "after").id).state == JobState.AVAILABLE
    assert app.backend.wait_for_jobs(["default"], 1.0) is True
    assert len(app.backend.list_jobs(limit=100_000).jobs) == len(every) + 1


def test_a_forked_child_runs_a_worker(app: Conveyor) -> None:
    done = threading.Event()
    ran: list[int] = []

    @app.task(name="fork.work")
    def work(n: int) -> int:
        ran.append(n)
        if len(ran) == 5:
            done.set()
        return n * 2

    other: Task[..., Any] = app.task(name="fork.other", queue="fork-other")(lambda n: None)
    ids = [work.enqueue(n).id for n in range(5)]
    _use_everything(app)

    def child() -> list[int]:
        worker = Worker(app, concurrency=2, poll_interval=0.05, maintenance_interval=0.05,
                        install_signal_handlers=False)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        finished = done.wait(REPORT_WITHIN_S / 2)
        worker.stop()
        thread.join(REPORT_WITHIN_S / 4)
        assert finished and not thread.is_alive()
        return sorted(ran)

    children = [_forked(child)]
    # The parent goes on using its app meanwhile (on a queue the child's worker does not take).
    later = [other.enqueue(n).id for n in range(20)]
    [ran_in_child] = _collect(children)

    assert ran_in_child == [0, 1, 2, 3, 4]
    assert ran == []  # the tasks ran in the child only
    assert [app.get_job(i).state for i in ids] == [JobState.SUCCEEDED] * 5
    assert [app.get_job(i).result for i in ids] == [0, 2, 4, 6, 8]
    assert [app.get_job(i).state for i in later] == [JobState.AVAILABLE] * 20
    assert app.backend.wait_for_jobs(["fork-other"], 1.0) is True
