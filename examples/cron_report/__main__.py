"""``python -m cron_report 2026-03-01T10``: queue the report of that hour (UTC) by hand."""

import datetime as dt
import sys

from .jobs import backfill

if len(sys.argv) != 2:
    sys.exit("usage: python -m cron_report YYYY-MM-DDTHH   (an hour, UTC)")
hour = dt.datetime.strptime(sys.argv[1], "%Y-%m-%dT%H").replace(tzinfo=dt.UTC)
job = backfill(hour)
print(f"queued job {job.id}: {job.task} {job.args}")
