"""Production shape of fork safety (issue 31, item 7): a gunicorn ``--preload`` server.

The master imports the app and uses it (pooled connections, a LISTEN connection, an idle wait
on another thread) and forks its workers while a thread of its own keeps enqueuing; each
worker process serves requests on several threads, each request one enqueue. Afterwards the
store holds exactly the jobs every process reported, no id twice, no process saw an error,
and the master's own connections still answer.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from scalekit import report, size
from support import collect, forked

from conveyor import Conveyor, JobState, Task

WORKERS = size(4, 12)  # forked processes
THREADS = size(4, 8)  # request threads per process
PER_THREAD = size(25, 500)  # enqueues per thread


def total_jobs(app: Conveyor) -> int:
    return sum(q.scheduled + q.available + q.running + q.succeeded + q.dead + q.cancelled
               for q in app.backend.stats().queues)


def test_a_preloaded_app_serves_from_forked_workers(app: Conveyor, store_url: str) -> None:
    note: Task[..., Any] = app.task(name="fork.request")(lambda who, n: None)
    first = note.enqueue("master", -1).id
    app.backend.wait_for_jobs(["fork-idle"], 0.01)
    stop = threading.Event()
    produced: list[int] = []

    def produce() -> None:
        while not stop.is_set():
            produced.append(note.enqueue("master", len(produced)).id)

    def idle() -> None:
        while not stop.is_set():
            app.backend.wait_for_jobs(["fork-idle"], 0.05)

    def serve() -> list[int]:
        got: list[list[int]] = [[] for _ in range(THREADS)]
        errors: list[BaseException] = []

        def requests(mine: list[int]) -> None:
            try:
                for n in range(PER_THREAD):
                    mine.append(note.enqueue(os.getpid(), n).id)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=requests, args=(g,)) for g in got]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return [i for g in got for i in g]

    master = [threading.Thread(target=produce), threading.Thread(target=idle)]
    for t in master:
        t.start()
    start = time.monotonic()
    try:
        children = [forked(serve) for _ in range(WORKERS)]
        reported = [i for ids in collect(children, size(120, 1800)) for i in ids]
    finally:
        stop.set()
        for t in master:
            t.join()
    seconds = time.monotonic() - start

    every = [first, *produced, *reported]
    assert len(reported) == WORKERS * THREADS * PER_THREAD
    assert len(set(every)) == len(every)
    stored = total_jobs(app)
    assert stored == len(every)
    # The master's connections were neither closed nor disturbed by its children.
    assert app.get_job(note.enqueue("master", "after").id).state == JobState.AVAILABLE
    assert app.backend.wait_for_jobs(["default"], 1.0) is True
    report("fork_preload", store_url.split(":", 1)[0], processes=WORKERS, threads_per_process=THREADS,
           enqueues_by_children=len(reported), enqueues_by_master=len(produced) + 1, rows_stored=stored,
           errors=0, seconds=round(seconds, 1), children_rate_per_s=round(len(reported) / seconds))
