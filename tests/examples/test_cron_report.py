"""examples/cron_report: Conveyor's cron makes one job per tick however many schedulers run,
the job reports on the hour before its tick, and the report stays right when it runs again."""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from support import running_worker, wait_for_job, wait_until

from conveyor import Conveyor, JobState
from conveyor.cli import load_app
from conveyor.cron import Scheduler

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
UTC = dt.UTC


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


def _ts(*args: int) -> float:
    return dt.datetime(*args, tzinfo=UTC).timestamp()


def test_one_job_per_tick_reporting_on_the_hour_before_it(
    tmp_path: Path, load_example: Callable[..., ModuleType]
) -> None:
    data = tmp_path / "reports.sqlite3"
    jobs = load_example("cron_report.jobs", CONVEYOR_URL=f"sqlite:///{tmp_path}/jobs.db", REPORTS_DB=str(data))
    app: Conveyor = jobs.app
    assert load_app("cron_report.jobs:app") is app  # the README's worker command
    _seed(data, [
        ("2026-03-01T09:59:59+00:00", 100),   # the hour before: not counted
        ("2026-03-01T10:00:00+00:00", 250),
        ("2026-03-01T10:42:00+00:00", 750),
        ("2026-03-01T11:00:00+00:00", 999),   # the hour after: not counted
    ])
    [schedule] = app.schedules.values()
    assert (schedule.name, schedule.expression, schedule.timezone) == ("reports.last-hour", "5 * * * *", "UTC")

    # Two workers' schedulers, driven with explicit times. The first sight of the schedule
    # records its latest tick (10:05) without running it.
    one, two = Scheduler(app), Scheduler(app)
    assert one.run_pending(now=_ts(2026, 3, 1, 10, 30)) == []
    # At 11:20 both see the 11:05 tick due: one job between them.
    made = one.run_pending(now=_ts(2026, 3, 1, 11, 20)) + two.run_pending(now=_ts(2026, 3, 1, 11, 21))
    assert len(made) == 1
    job = app.get_job(made[0].id)
    assert job.task == "reports.last_hour" and job.queue == "reports"
    assert job.meta["cron"]["tick"] == _ts(2026, 3, 1, 11, 5)

    with running_worker(app, queues="reports", scheduler=False):
        done = wait_for_job(app, job.id)
        assert done.state is JobState.SUCCEEDED, done.errors
        # Run at whatever time it is now, it reported on 10:00-11:00: the hour before its tick.
        assert done.result == {"hour": "2026-03-01T10:00:00+00:00", "sales": 2, "total_cents": 1000}
        assert _reports(data) == [("2026-03-01T10:00:00+00:00", 2, 1000)]

        # A late sale, then a backfill of the same hour: the upsert corrects the one row.
        _seed(data, [("2026-03-01T10:59:00+00:00", 5)])
        again = jobs.backfill(dt.datetime(2026, 3, 1, 10, tzinfo=UTC))
        assert again.args == {"hour": "2026-03-01T10:00:00+00:00"}
        assert wait_for_job(app, again.id).state is JobState.SUCCEEDED
    assert _reports(data) == [("2026-03-01T10:00:00+00:00", 3, 1005)]

    # Later ticks: only the latest due one runs after a gap (11:05 was taken; 12:05 and
    # 13:05 are due at 13:30, and the missed 12:05 is skipped).
    [late] = one.run_pending(now=_ts(2026, 3, 1, 13, 30))
    assert app.get_job(late.id).meta["cron"]["tick"] == _ts(2026, 3, 1, 13, 5)


def test_a_worker_runs_the_schedule_by_itself(tmp_path: Path, load_example: Callable[..., ModuleType]) -> None:
    data = tmp_path / "reports.sqlite3"
    jobs = load_example("cron_report.jobs", CONVEYOR_URL=f"sqlite:///{tmp_path}/jobs.db", REPORTS_DB=str(data))
    app: Conveyor = jobs.app
    # The same task on a schedule that ticks every second, so the worker's own scheduler
    # loop gets to enqueue a tick within the test.
    app.schedule(jobs.report_last_hour, "* * * * * *", name="test.every-second")

    def cron_jobs() -> list[object]:
        return [j for j in app.backend.list_jobs(state=JobState.SUCCEEDED, limit=100).jobs if "cron" in j.meta]

    with running_worker(app, queues="reports"):
        [first, *_] = wait_until(cron_jobs, timeout=20, message="the worker's scheduler ran a tick")
    tick = dt.datetime.fromtimestamp(first.meta["cron"]["tick"], UTC)  # type: ignore[attr-defined]
    hour = jobs.hour_before(tick).isoformat()
    assert first.result["hour"] == hour  # type: ignore[attr-defined]
    assert (hour, 0, 0) in _reports(data)


def test_python_dash_m_cron_report_backfills_an_hour(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/jobs.db"
    env = {**os.environ, "CONVEYOR_URL": url, "REPORTS_DB": str(tmp_path / "reports.sqlite3")}
    out = subprocess.run([sys.executable, "-m", "cron_report", "2026-03-01T10"], cwd=EXAMPLES, env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.startswith("queued job ")
    app = Conveyor(url)
    try:
        [job] = app.backend.list_jobs().jobs
    finally:
        app.close()
    assert job.task == "reports.hourly" and job.state is JobState.AVAILABLE
    assert job.args == {"hour": "2026-03-01T10:00:00+00:00"}
    assert job.unique_key == "reports.hourly:2026-03-01T10"
