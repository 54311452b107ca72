"""``python -m cron_report``: queue the report of the last full hour (run it from cron)."""

import datetime as dt

from .jobs import queue_report

job = queue_report(dt.datetime.now(dt.UTC))
print(f"queued job {job.id}: {job.task} {job.args}")
