"""Control characters made visible: a NUL, an ESC sequence or a CR/LF from job data must not
reach a page or a log line as itself (it could hide text, recolour a terminal or forge a line)."""

from __future__ import annotations

import re

# C0 controls, DEL, C1 controls, and the Unicode characters that reorder or split text
# (bidi overrides and isolates, line and paragraph separators).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def escape_controls(text: str, keep: str = "") -> str:
    """``text`` with every control character written as an escape (``\\x00``, ``\\r``,
    ``\\u202e``), except those in ``keep`` (e.g. ``"\\n\\t"`` for a traceback shown as is)."""
    if not _CONTROL.search(text):
        return text
    if keep:
        return _CONTROL.sub(lambda m: m.group() if m.group() in keep else _escape(m), text)
    return _CONTROL.sub(_escape, text)
