"""SQLite: another process's write wakes an idle waiter; it does not wait for a poll.

An idle worker learns of a job another process enqueued by looking at the file. Polling it
every 2 ms costs an idle worker 500 wake-ups a second and adds up to 2 ms to each pick-up;
on Linux the file is watched (inotify) and the write itself wakes the waiter. Here the
polling is made so slow (a minute a nap) that only the watch can end the wait in time; the
bounds below are hang detectors, not measurements.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support import collect, forked, new_job

from conveyor.backends.sqlite import SqliteBackend, filewatch

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")
SLOW_NAP = 60.0
HANG_S = 30.0  # far below SLOW_NAP: a wait that ends sooner was woken, not timed out

ENQUEUE = """
import sys
from conveyor.backends.sqlite import SqliteBackend
from conveyor.backends.base import NewJob
b = SqliteBackend(sys.argv[1])
b.enqueue_many([NewJob(task="t.x", queue="default", args="{}", max_attempts=3, timeout=30.0)])
b.close()
"""


def _slow(backend: SqliteBackend) -> SqliteBackend:
    backend.poll_step = SLOW_NAP
    backend.watched_poll_step = SLOW_NAP
    backend.due_check_interval = SLOW_NAP
    return backend


def _wait_in_thread(backend: SqliteBackend) -> tuple[threading.Thread, list[bool]]:
    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(backend.wait_for_jobs(["default"], 120.0)),
                         daemon=True)
    t.start()
    return t, result


def _enqueue_elsewhere(url: str) -> None:
    subprocess.run([sys.executable, "-c", ENQUEUE, url], check=True, timeout=HANG_S)


@linux
def test_a_write_by_another_process_wakes_the_idle_waiter(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    worker = _slow(SqliteBackend(url))
    try:
        assert worker.wait_for_jobs(["default"], 0.01) is False  # idle; the watch is made
        assert worker._watching()
        t, result = _wait_in_thread(worker)
        _enqueue_elsewhere(url)
        t.join(HANG_S)
        assert not t.is_alive(), "the waiter slept through another process's enqueue"
        assert result == [True]
        assert worker.claim("default", 1, worker_id="w", lease_s=30)
    finally:
        worker.close()


@linux
def test_writes_that_make_no_job_do_not_end_the_wait(tmp_path: Path) -> None:
    """The watch only makes the waiter look: a write that makes nothing claimable (another
    queue's job) is looked at and slept on, not reported."""
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    worker = _slow(SqliteBackend(url))
    try:
        assert worker.wait_for_jobs(["default"], 0.01) is False
        changes = worker._signal.changes
        other = SqliteBackend(url)
        other.enqueue_many([new_job(queue="elsewhere")])
        other.close()
        # The watch saw it (nudged), and a short wait still says nothing is there.
        deadline = threading.Event()
        for _ in range(300):
            if worker._signal.changes != changes:
                break
            deadline.wait(0.01)
        assert worker._signal.changes != changes
        assert worker.wait_for_jobs(["default"], 0.05) is False
    finally:
        worker.close()


def test_without_inotify_the_waiter_polls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(filewatch, "_libc", lambda: None)
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    worker = SqliteBackend(url)
    try:
        assert worker.wait_for_jobs(["default"], 0.01) is False
        assert not worker._watching()
        t, result = _wait_in_thread(worker)  # polls every poll_step (2 ms)
        _enqueue_elsewhere(url)
        t.join(HANG_S)
        assert result == [True]
    finally:
        worker.close()


@linux
def test_a_forked_child_watches_the_file_itself(tmp_path: Path) -> None:
    """The watch's thread is the parent's: a child makes its own, and its waits are woken by
    writes the parent makes."""
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    parent = SqliteBackend(url)
    try:
        assert parent.wait_for_jobs(["default"], 0.01) is False
        assert parent._watching()

        def child() -> list[object]:
            b = _slow(parent)
            made_anew = b._watch_use is None and b._signal.watch is None
            return [made_anew, b.wait_for_jobs(["default"], 120.0)]

        kid = forked(child)
        threading.Event().wait(0.5)  # the child is waiting (if not yet, it finds the job)
        _enqueue_elsewhere(url)
        assert collect([kid], HANG_S) == [[True, True]]
        assert parent._watching()  # the parent's watch is untouched by the child
    finally:
        parent.close()


@linux
def test_close_stops_the_watch(tmp_path: Path) -> None:
    worker = SqliteBackend(f"sqlite:///{tmp_path / 'jobs.db'}")
    worker.wait_for_jobs(["default"], 0.01)
    watch = worker._signal.watch
    assert watch is not None and watch.alive
    worker.close()
    assert not watch.alive
    assert watch._thread not in threading.enumerate()


def _watch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "conveyor-sqlite-watch"]


@linux
def test_backends_on_one_file_share_one_watch(tmp_path: Path) -> None:
    """A process with many backends on one file (a web server's app per thread, a test suite's
    fixtures) makes one watch, not one each: each would hold a thread and an inotify instance,
    of which a user has 128 by default, so past that the waiters fell back to polling. The
    watch runs until the last of them lets go."""
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    before = len(_watch_threads())
    backends = [SqliteBackend(url) for _ in range(200)]
    try:
        for b in backends:
            assert b.wait_for_jobs(["default"], 0.001) is False
            assert b._watching()
        assert len(_watch_threads()) == before + 1
        watch = backends[0]._signal.watch
        assert watch is not None and all(b._signal.watch is watch for b in backends)
        for b in backends[:-1]:
            b.close()
        assert watch.alive and backends[-1]._watching()
        # The last one still hears another process's write.
        t, result = _wait_in_thread(_slow(backends[-1]))
        _enqueue_elsewhere(url)
        t.join(HANG_S)
        assert result == [True]
    finally:
        for b in backends:
            b.close()
    assert not watch.alive and len(_watch_threads()) == before


@linux
def test_a_backend_nobody_closed_lets_go_of_the_watch(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    kept = SqliteBackend(url)
    dropped = SqliteBackend(url)
    try:
        kept.wait_for_jobs(["default"], 0.001)
        dropped.wait_for_jobs(["default"], 0.001)
        signal = kept._signal
        assert signal.watch_users == 2
        del dropped
        gc.collect()
        assert signal.watch_users == 1 and signal.watched
    finally:
        kept.close()
    assert signal.watch_users == 0 and signal.watch is None


@linux
def test_a_write_seen_before_its_commit_shows_is_looked_at_until_it_does(tmp_path: Path) -> None:
    """With synchronous=FULL a commit writes the WAL, then syncs it, and only then shows (in the
    -shm index, written through a mapping inotify does not report): the watch's nudge comes
    before the commit can be seen. The waiter then looks at the short step until it shows; it
    napped the watched step (50 ms) instead, which made every idle pick-up on the default
    durability 51 ms (benchmark of 7 December). Here the nudge is made by hand and the watch's
    own ones are cut, so only the short step can see the commit a subprocess makes after it."""
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    worker = _slow(SqliteBackend(url))
    worker.poll_step = 0.002
    worker.commit_settle = SLOW_NAP  # the subprocess's start fits in it
    try:
        assert worker.wait_for_jobs(["default"], 0.01) is False
        watch = worker._signal.watch
        assert watch is not None
        watch._on_change = lambda: None  # real writes nudge no more
        t, result = _wait_in_thread(worker)
        threading.Event().wait(0.2)  # the waiter is napping the watched step (a minute)
        worker._signal.nudge()  # a WAL write of a commit that does not show yet
        threading.Event().wait(0.2)  # looked, saw no commit
        _enqueue_elsewhere(url)
        t.join(HANG_S)
        assert not t.is_alive(), "the waiter napped the watched step through the commit"
        assert result == [True]
    finally:
        worker.close()


@linux
def test_a_write_seen_between_two_waits_is_looked_for_by_the_next(tmp_path: Path) -> None:
    """The nudge of a commit on its way can come while the worker is between waits (its claim
    came back empty): the next wait must not take the file as seen and nap. It made the idle
    pick-up's p99 51 ms at synchronous=FULL (9 of 300 probes past 40 ms; 0-1 after)."""
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    worker = _slow(SqliteBackend(url))
    worker.poll_step = 0.002
    worker.commit_settle = SLOW_NAP
    try:
        assert worker.wait_for_jobs(["default"], 0.01) is False
        watch = worker._signal.watch
        assert watch is not None
        watch._on_change = lambda: None
        worker._signal.nudge()  # between two waits
        t, result = _wait_in_thread(worker)
        threading.Event().wait(0.2)
        _enqueue_elsewhere(url)
        t.join(HANG_S)
        assert not t.is_alive(), "the wait took the write as seen and napped"
        assert result == [True]
    finally:
        worker.close()
