"""Turning job data into text for the pages: times, ages, JSON, and secrets masked.

Everything here returns plain strings; the templates escape them (autoescape is on and
nothing from a job is ever marked safe).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from ..redact import MASK as MASK
from ..redact import SENSITIVE_KEY as SENSITIVE_KEY
from ..redact import URL_PASSWORD as URL_PASSWORD
from ..redact import mask_text as mask_text
from ..redact import redact as redact
from ..redact import redact_keys, shown_json, shown_text

NONE = "\u2013"  # an en dash: "no value"
# The most of one value, message or traceback a page shows (`conveyor jobs show --json` has
# all): job data is clipped before it is masked, so a huge value costs a page no more than this.
SHOWN_CHARS = 16_000


def to_json(value: Any, *, pretty: bool = False, limit: int = SHOWN_CHARS) -> str:
    if pretty:
        return shown_json(value, limit, indent=2)
    return shown_json(value, limit, separators=(", ", ": "))


def mask(text: str, limit: int = SHOWN_CHARS) -> str:
    """Text from a job as a page shows it: clipped, then secrets masked."""
    return shown_text(text, limit)


def call_preview(args: dict[str, Any], limit: int = 90) -> str:
    shown = redact_keys(args)
    text = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in shown.items())
    return shorten(shown_text(text, 4 * limit, say_cut=False), limit)


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
