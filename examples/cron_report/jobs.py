"""An hourly sales report, scheduled by Conveyor's cron.

Every worker of this app runs the scheduler; however many run, each tick makes one job.
The job carries the tick it was made for, so a report that runs late (every worker was
down at 11:05 and came back at 11:40) still reports on the right hour.

Run a worker from the ``examples/`` directory; it runs the schedule and the jobs::

    CONVEYOR_URL=sqlite:///reports-jobs.db REPORTS_DB=reports.sqlite3 \\
        conveyor --app cron_report.jobs:app worker
    conveyor --app cron_report.jobs:app cron list          # the schedule, its last and next tick
    python -m cron_report 2026-03-01T10                    # backfill one hour by hand
"""

from __future__ import annotations

import datetime as dt
import os
import sqlite3

from conveyor import Conveyor, Job, current_job

app = Conveyor(os.environ.get("CONVEYOR_URL", "sqlite:///reports-jobs.db"))

# The application's own data: sales, and the reports built from them.
DATA = os.environ.get("REPORTS_DB", "reports.sqlite3")

SCHEMA = """
CREATE TABLE IF NOT EXISTS sales (
    id           INTEGER PRIMARY KEY,
    sold_at      TEXT    NOT NULL,   -- ISO 8601, UTC
    amount_cents INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS hourly_reports (
    hour        TEXT PRIMARY KEY,    -- the hour's start, ISO 8601, UTC
    sales       INTEGER NOT NULL,
    total_cents INTEGER NOT NULL,
    built_at    TEXT    NOT NULL
);
"""


def connect() -> sqlite3.Connection:
    db = sqlite3.connect(DATA, timeout=30)
    db.executescript(SCHEMA)
    return db


def hour_before(tick: dt.datetime) -> dt.datetime:
    """The start of the last full hour before ``tick`` (an aware datetime), in UTC."""
    if tick.tzinfo is None:
        raise ValueError(f"tick {tick!r} has no timezone")
    return tick.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=1)


@app.task(name="reports.hourly", queue="reports", max_attempts=5, timeout=300)
def hourly_report(hour: str) -> dict[str, int | str]:
    """Summarise the sales of the hour starting at ``hour`` (ISO 8601, UTC) into ``hourly_reports``.

    An upsert keyed by the hour: running it twice (a retry, a redelivery after a crash, a
    backfill of an hour cron already did) writes the same row again, never a second one.
    """
    start = dt.datetime.fromisoformat(hour)
    end = start + dt.timedelta(hours=1)
    with connect() as db:
        count, total = db.execute(
            "SELECT count(*), coalesce(sum(amount_cents), 0) FROM sales WHERE sold_at >= ? AND sold_at < ?",
            (start.isoformat(), end.isoformat()),
        ).fetchone()
        db.execute(
            "INSERT INTO hourly_reports (hour, sales, total_cents, built_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (hour) DO UPDATE SET sales = excluded.sales, total_cents = excluded.total_cents,"
            " built_at = excluded.built_at",
            (start.isoformat(), count, total, dt.datetime.now(dt.UTC).isoformat()),
        )
    return {"hour": start.isoformat(), "sales": count, "total_cents": total}


# Five minutes past every hour, UTC: late sales of the hour before have come in by then.
@app.cron("5 * * * *", timezone="UTC", name="reports.last-hour")
@app.task(name="reports.last_hour", queue="reports", max_attempts=5, timeout=300)
def report_last_hour() -> dict[str, int | str]:
    """Cron's entry point: the report of the last full hour before this job's tick."""
    ctx = current_job()
    tick = ctx.cron_tick if ctx is not None else None
    if tick is None:  # run by hand, not by the schedule: use the time now
        tick = dt.datetime.now(dt.UTC)
    return hourly_report(hour_before(tick).isoformat())


def backfill(hour: dt.datetime) -> Job:
    """Queue the report of the hour starting at ``hour`` (aware), e.g. after fixing old sales.

    The unique key makes a double call harmless while the first job is unfinished.
    """
    start = hour_before(hour + dt.timedelta(hours=1))
    return hourly_report.options(unique_key=f"reports.hourly:{start:%Y-%m-%dT%H}").enqueue(start.isoformat())
