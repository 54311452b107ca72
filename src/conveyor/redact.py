"""Secrets kept off screens and out of logs: values of secret-named keys, and passwords in
URLs found inside any text (DSNs in arguments, error messages, tracebacks).

Used by everything that shows job data: the dashboard, the CLI and the worker's log lines.
The stored job is left as it was: masking is for what people see.
"""

from __future__ import annotations

import re
from typing import Any

# Values of these keys are shown as *** wherever they appear in args, results and metadata.
SENSITIVE_KEY = re.compile(r"(?i)(pass(word|wd|phrase)?|secret|token|api[_-]?key|auth(orization)?|credential|"
                           r"private[_-]?key|cookie|session)")
# user:password@ in any URL-looking string.
URL_PASSWORD = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@/\s]+)@")
MASK = "***"


def mask_text(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ***."""
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
