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

import os
import threading
from collections.abc import Callable
from typing import Any

import pytest
from support import collect, forked

from conveyor import Conveyor, JobState, Task
from conveyor.backends.base import Backend
from conveyor.worker import Worker

CHILDREN = 4
PER_PROCESS = 25
REPORT_WITHIN_S = 30.0  # only a hung child takes this long; it is killed then


def _use_everything(app: Conveyor) -> None:
    """Open what an app in use holds: pooled connections, and a waiting worker's (LISTEN on
    PostgreSQL, the blocking pop's on Redis)."""
    app.backend.wait_for_jobs(["fork-nothing"], 0.01)


@pytest.mark.needs("listing")
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
        children = [forked(child) for _ in range(CHILDREN)]
        mine = [note.enqueue("parent", n).id for n in range(PER_PROCESS)]
        reported = [i for ids in collect(children, REPORT_WITHIN_S) for i in ids]
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


@pytest.mark.needs("lookup")
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

    children = [forked(child)]
    # The parent goes on using its app meanwhile (on a queue the child's worker does not take).
    later = [other.enqueue(n).id for n in range(20)]
    [ran_in_child] = collect(children, REPORT_WITHIN_S)

    assert ran_in_child == [0, 1, 2, 3, 4]
    assert ran == []  # the tasks ran in the child only
    assert [app.get_job(i).state for i in ids] == [JobState.SUCCEEDED] * 5
    assert [app.get_job(i).result for i in ids] == [0, 2, 4, 6, 8]
    assert [app.get_job(i).state for i in later] == [JobState.AVAILABLE] * 20
    assert app.backend.wait_for_jobs(["fork-other"], 1.0) is True


@pytest.mark.needs("locks")
def test_a_forked_child_never_frees_its_parents_store_locks(
        open_store: Callable[[], Backend]) -> None:
    """A lock the parent holds (the pruner's) is the parent's alone: a child that closes its
    copy of the backend, as any child does on its way out, must not free it (closing the
    PostgreSQL lock's connection would end the parent's session; an unlock with the copied Redis
    token or flock descriptor would free the parent's lock)."""
    parent = open_store()
    other = open_store()
    held = parent.try_lock("prune", ttl=60)
    assert held is not None

    def child() -> bool:
        parent.close()
        return True

    assert collect([forked(child)], REPORT_WITHIN_S) == [True]
    assert other.try_lock("prune", ttl=60) is None  # still the parent's
    held.release()
    again = other.try_lock("prune", ttl=60)
    assert again is not None
    again.release()
