"""Logging setup: readable lines by default, one JSON object per line with ``--log-format json``.

Job events carry ``job_id``, ``task``, ``queue``, ``attempt``, ``max_attempts``, ``outcome`` and
``worker_id`` as record attributes; the JSON format emits them as fields.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from types import TracebackType

from .textsafe import escape_controls

ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]
JOB_FIELDS = ("job_id", "task", "queue", "attempt", "max_attempts", "outcome", "worker_id")


class TextFormatter(logging.Formatter):
    """Readable lines in which a message is always one line: a CR or LF (or an ESC sequence)
    inside an error message is written as an escape, so job data cannot forge a log line.
    Tracebacks keep their lines; control characters inside them are escaped too."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        """The message line, CR, LF and ESC written as escapes."""
        return escape_controls(super().formatMessage(record))

    def formatException(self, ei: ExcInfo) -> str:
        """The traceback, its own line breaks kept, other control characters escaped."""
        return escape_controls(super().formatException(ei), keep="\n")

    def formatStack(self, stack_info: str) -> str:
        """The stack, its own line breaks kept, other control characters escaped."""
        return escape_controls(super().formatStack(stack_info), keep="\n")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time``, ``level``, ``logger``, ``message``, the job fields
    present on the record, and ``exception`` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        created = dt.datetime.fromtimestamp(record.created, tz=dt.UTC)
        entry: dict[str, object] = {
            "time": created.isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in JOB_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Send every log record to stderr at ``level``, as text lines or (``fmt="json"``) JSON.

    Replaces the root logger's handlers; the CLI calls it. An application embedding a worker
    can skip it and configure logging its own way (loggers are named ``conveyor.*``).
    """
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
