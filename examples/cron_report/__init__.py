"""A cron-driven report: an hourly sales summary, queued once per hour however often cron fires."""
