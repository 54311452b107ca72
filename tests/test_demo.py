"""``conveyor demo`` end to end: a real process, a real SQLite file, read back afterwards."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor import Conveyor, Job, JobState

pytestmark = pytest.mark.process


def demo_env() -> dict[str, str]:
    env = dict(os.environ)
    # The demo must not depend on these; make sure a developer's settings don't leak in.
    for key in ("CONVEYOR_URL", "CONVEYOR_APP"):
        env.pop(key, None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def all_jobs(app: Conveyor) -> list[Job]:
    jobs: list[Job] = []
    cursor: int | None = None
    while True:
        page = app.backend.list_jobs(cursor=cursor, limit=500)
        jobs += page.jobs
        if page.next_cursor is None:
            return jobs
        cursor = page.next_cursor


@contextlib.contextmanager
def open_store(path: Path) -> Iterator[Conveyor]:
    app = Conveyor(f"sqlite:///{path}")
    try:
        yield app
    finally:
        app.close()


def check_store(path: Path, *, min_succeeded: int) -> None:
    with open_store(path) as app:
        jobs = all_jobs(app)
        by_state = {state: [j for j in jobs if j.state is state] for state in JobState}
        succeeded = by_state[JobState.SUCCEEDED]
        assert len(succeeded) >= min_succeeded, {s.value: len(js) for s, js in by_state.items()}
        retried_then_ok = [j for j in succeeded if j.attempts >= 2]
        assert retried_then_ok, "no job succeeded after a retry"
        assert all(j.errors for j in retried_then_ok), "a retried job has no error recorded"
        dead = by_state[JobState.DEAD]
        assert dead, "no job went dead"
        assert all(j.errors and j.errors[-1].get("message") for j in dead), "a dead job has no error recorded"
        assert {j.errors[-1]["kind"] for j in dead} >= {"rejected"}, "no job was rejected (Reject -> dead at once)"
        assert any(j.attempts == j.max_attempts == 3 for j in dead), "no job used up its 3 attempts"
        assert not by_state[JobState.RUNNING], f"jobs left running: {[j.id for j in by_state[JobState.RUNNING]]}"
        assert app.backend.stats().workers == [], "the worker did not remove its row on shutdown"


def test_demo_runs_for_its_duration(tmp_path: Path) -> None:
    db = tmp_path / "d.db"
    proc = subprocess.run(
        [sys.executable, "-m", "conveyor", "demo", "--duration", "6", "--db", str(db), "--no-live"],
        capture_output=True, text=True, timeout=90, cwd=tmp_path, env=demo_env(),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Demo finished" in proc.stdout
    assert "time limit of 6s reached" in proc.stdout
    assert str(db) in proc.stdout
    assert "dlq list" in proc.stdout
    check_store(db, min_succeeded=20)


def test_demo_stops_gracefully_on_sigint(tmp_path: Path) -> None:
    db = tmp_path / "d.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor", "demo", "--db", str(db), "--no-live"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=demo_env(),
    )
    try:
        # Wait until the demo has done some real work (the file appears only once the demo made it).
        deadline = time.monotonic() + 60
        progress = 0
        while progress < 30 and proc.poll() is None:
            assert time.monotonic() < deadline, "the demo made no progress in 60s"
            time.sleep(0.2)
            if not db.exists():
                continue
            with open_store(db) as app:
                progress = sum(q.succeeded + q.dead for q in app.backend.stats().queues)
        assert proc.poll() is None, "the demo exited on its own"
        # Let the retries and dead jobs of the first burst happen too.
        time.sleep(2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out + err
    assert "stopped by Ctrl-C" in out
    assert "Demo finished" in out
    assert "succeeded" in out and "dead" in out
    check_store(db, min_succeeded=20)


def test_demo_refuses_a_store_that_is_not_its_own(tmp_path: Path) -> None:
    db = tmp_path / "real.db"
    with open_store(db) as app:

        @app.task(name="billing.invoice")
        def invoice(customer_id: int) -> None: ...

        invoice.enqueue(1)
    for flag in ("--fresh", "--keep"):
        proc = subprocess.run(
            [sys.executable, "-m", "conveyor", "demo", flag, "--duration", "1", "--db", str(db), "--no-live"],
            capture_output=True, text=True, timeout=60, cwd=tmp_path, env=demo_env(),
        )
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "holds jobs that are not the demo's" in proc.stdout + proc.stderr
    with open_store(db) as app:
        assert [j.task for j in all_jobs(app)] == ["billing.invoice"]
