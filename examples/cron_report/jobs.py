"""The report task, and the function cron calls to queue it.

Conveyor's own cron (``@app.cron``) lands with issue 5. Until then the system's cron (or a
Kubernetes CronJob, or a systemd timer) runs ``python -m cron_report`` a few minutes past
every hour; see ``README.md`` beside this file. The task does not change when the schedule
moves into Conveyor.
"""

from __future__ import annotations

import datetime as dt
import os
import sqlite3

from conveyor import Conveyor, Job

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


@app.task(name="reports.hourly", queue="reports", max_attempts=5, timeout=300)
def hourly_report(hour: str) -> dict[str, int | str]:
    """Summarise the sales of the hour starting at ``hour`` (ISO 8601, UTC) into ``hourly_reports``.

    An upsert keyed by the hour: running it twice (a retry, a redelivery after a crash, a
    second tick for the same hour) writes the same row again, never a second one.
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


def queue_report(tick: dt.datetime) -> Job:
    """Queue the report of the last full hour before ``tick`` (an aware datetime).

    The unique key is the hour: if cron fires twice (two machines, a retried CronJob) while
    that hour's report is still waiting or running, the second call returns the first job.
    A call after it finished queues a new run, which the upsert makes harmless.
    """
    if tick.tzinfo is None:
        raise ValueError(f"tick {tick!r} has no timezone")
    hour = tick.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=1)
    return hourly_report.options(unique_key=f"reports.hourly:{hour:%Y-%m-%dT%H}").enqueue(hour.isoformat())
