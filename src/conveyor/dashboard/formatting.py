"""Turning job data into text for the pages: times, ages, JSON, and secrets masked.

Everything here returns plain strings; the templates escape them (autoescape is on and
nothing from a job is ever marked safe).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

NONE = "\u2013"  # an en dash: "no value"

# Values of these keys are shown as *** wherever they appear in args, results and metadata.
SENSITIVE_KEY = re.compile(r"(?i)(pass(word|wd|phrase)?|secret|token|api[_-]?key|auth(orization)?|credential|"
                           r"private[_-]?key|cookie|session)")
# user:password@ in any URL-looking string (DSNs in args, error messages, tracebacks).
URL_PASSWORD = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@/\s]+)@")
MASK = "***"


def mask_text(text: str) -> str:
    return URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)


def redact(value: Any) -> Any:
    """A copy of a JSON value with sensitive keys' values masked and URL passwords hidden."""
    if isinstance(value, dict):
        return {k: (MASK if isinstance(k, str) and SENSITIVE_KEY.search(k) and v not in (None, "")
                    else redact(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return mask_text(value)
    return value


def to_json(value: Any, *, pretty: bool = False) -> str:
    if pretty:
        return json.dumps(redact(value), indent=2, ensure_ascii=False, sort_keys=False)
    return json.dumps(redact(value), ensure_ascii=False, separators=(", ", ": "))


def call_preview(args: dict[str, Any], limit: int = 90) -> str:
    text = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in redact(args).items())
    return shorten(text, limit)


def shorten(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return NONE
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        m, s = divmod(int(seconds), 60)
        return f"{m}m {s:02d}s"
    if seconds < 86400:
        h, rem = divmod(int(seconds), 3600)
        return f"{h}h {rem // 60:02d}m"
    d, rem = divmod(int(seconds), 86400)
    return f"{d}d {rem // 3600}h"


def ago(ts: float | None, now: float) -> str:
    if ts is None:
        return NONE
    delta = now - ts
    if delta < -1:
        return "in " + duration(-delta)
    if delta < 1:
        return "just now"
    return duration(delta) + " ago"


def when(ts: float | None) -> str:
    if ts is None:
        return NONE
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def iso(ts: float | None) -> str:
    if ts is None:
        return ""
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).isoformat(timespec="seconds")


def count(n: int | float) -> str:
    return f"{int(n):,}".replace(",", "\u202f")


def rate(per_second: float | None) -> str:
    if per_second is None:
        return NONE
    if per_second >= 100:
        return f"{per_second:,.0f}/s"
    if per_second >= 1:
        return f"{per_second:.1f}/s"
    if per_second > 0:
        return f"{per_second * 60:.1f}/min"
    return "0/s"
