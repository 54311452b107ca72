"""SQLite's idle wait looks at the file before its first nap.

An idle worker waits right after a claim that got nothing; under a steady load a job often
comes in between (another process's enqueue). Such a job is already waiting when the wait
starts, and the wait must report it at once (the Backend contract), not after a poll step
spent asleep: that nap was added to the pick-up of every job that arrived in the gap.

The nap is counted, not timed: the signal's condition is replaced by one that records its
waits, and the poll step made long enough that a nap could not go unnoticed.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from support import new_job

from conveyor.backends.sqlite import SqliteBackend


class CountingCondition:
    """A threading.Condition that counts the waits made on it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.waits = 0

    def __enter__(self) -> Any:
        return self._cond.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._cond.__exit__(*exc)

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return self._cond.wait(timeout)

    def notify_all(self) -> None:
        self._cond.notify_all()


def test_a_job_enqueued_before_the_wait_is_reported_without_a_nap(
    tmp_path: Path,
) -> None:
    db = tmp_path / "jobs.db"
    worker = SqliteBackend(f"sqlite:///{db}")
    try:
        assert worker.claim("default", 1, worker_id="w", lease_s=30) == []
        # Enqueued before the wait starts (its in-process wake-up is over by then too).
        producer = SqliteBackend(f"sqlite:///{db}")
        producer.enqueue_many([new_job()])
        producer.close()
        cond = CountingCondition()
        worker._signal.cond = cond  # type: ignore[assignment]
        worker.poll_step = 5.0
        assert worker.wait_for_jobs(["default"], 60.0) is True
        assert cond.waits == 0
    finally:
        worker.close()


def test_with_nothing_waiting_the_wait_still_naps_between_looks(tmp_path: Path) -> None:
    backend = SqliteBackend(f"sqlite:///{tmp_path / 'jobs.db'}")
    try:
        cond = CountingCondition()
        backend._signal.cond = cond  # type: ignore[assignment]
        assert backend.wait_for_jobs(["default"], 0.05) is False
        assert cond.waits >= 1
    finally:
        backend.close()
