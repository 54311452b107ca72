"""examples/cron_report: one report job per hour however often cron fires, and a report
that stays right when it runs again."""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from support import running_worker, wait_for_job

from conveyor import Conveyor, JobState

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _seed(path: Path, sales: list[tuple[str, int]]) -> None:
    with sqlite3.connect(path) as db:
        db.executescript(
            "CREATE TABLE IF NOT EXISTS sales (id INTEGER PRIMARY KEY, sold_at TEXT NOT NULL,"
            " amount_cents INTEGER NOT NULL)"
        )
        db.executemany("INSERT INTO sales (sold_at, amount_cents) VALUES (?, ?)", sales)


def _reports(path: Path) -> list[tuple[str, int, int]]:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT hour, sales, total_cents FROM hourly_reports ORDER BY hour").fetchall()


def test_cron_queues_each_hour_once_and_the_report_is_idempotent(
    tmp_path: Path, load_example: Callable[..., ModuleType]
) -> None:
    data = tmp_path / "reports.sqlite3"
    jobs = load_example("cron_report.jobs", CONVEYOR_URL=f"sqlite:///{tmp_path}/jobs.db", REPORTS_DB=str(data))
    _seed(data, [
        ("2026-03-01T09:59:59+00:00", 100),   # the hour before: not counted
        ("2026-03-01T10:00:00+00:00", 250),
        ("2026-03-01T10:42:00+00:00", 750),
        ("2026-03-01T11:00:00+00:00", 999),   # the hour after: not counted
    ])
    app: Conveyor = jobs.app

    # Cron fired twice for the 11:05 tick (two machines): one job.
    tick = dt.datetime(2026, 3, 1, 11, 5, tzinfo=dt.UTC)
    first = jobs.queue_report(tick)
    second = jobs.queue_report(tick.astimezone(dt.timezone(dt.timedelta(hours=2))))  # same instant
    assert second.id == first.id
    assert first.args == {"hour": "2026-03-01T10:00:00+00:00"}
    assert first.unique_key == "reports.hourly:2026-03-01T10"

    with running_worker(app, queues="reports"):
        done = wait_for_job(app, first.id)
        assert done.state is JobState.SUCCEEDED, done.errors
        assert done.result == {"hour": "2026-03-01T10:00:00+00:00", "sales": 2, "total_cents": 1000}
        assert _reports(data) == [("2026-03-01T10:00:00+00:00", 2, 1000)]

        # A late sale, then the same hour queued again after the first run finished: a new
        # job, and the upsert rewrites the one row instead of adding a second.
        _seed(data, [("2026-03-01T10:59:00+00:00", 5)])
        again = jobs.queue_report(tick)
        assert again.id != first.id
        assert wait_for_job(app, again.id).state is JobState.SUCCEEDED
    assert _reports(data) == [("2026-03-01T10:00:00+00:00", 3, 1005)]


def test_python_dash_m_cron_report_queues_the_last_full_hour(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/jobs.db"
    env = {**os.environ, "CONVEYOR_URL": url, "REPORTS_DB": str(tmp_path / "reports.sqlite3")}
    out = subprocess.run([sys.executable, "-m", "cron_report"], cwd=EXAMPLES, env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert out.startswith("queued job ")
    app = Conveyor(url)
    try:
        [job] = app.backend.list_jobs().jobs
    finally:
        app.close()
    now = dt.datetime.now(dt.UTC)
    hour = dt.datetime.fromisoformat(job.args["hour"])
    assert job.task == "reports.hourly" and job.state is JobState.AVAILABLE
    assert dt.timedelta(hours=1) <= now - hour < dt.timedelta(hours=2, minutes=1)  # an hour may turn meanwhile
