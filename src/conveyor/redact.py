"""Secrets kept off screens and out of logs: values of secret-named keys, and the secrets found
inside any text (DSNs in arguments, query strings, libpq strings, headers, reprs, tracebacks).

Used by everything that shows job data: the dashboard, the CLI and the worker's log lines.
The stored job is left as it was: masking is for what people see.

Job data is untrusted and may be large, so every pattern here does work linear in the text:
each one starts with a literal or a short alternation of literals (the engine skips ahead to
them), every repetition is bounded or runs over characters that cannot start the next part,
and no quantifier is nested in another that could match the same characters. The URL scan
looks at each ``://`` once and never past the next one. Still, screens clip what they show
before masking it (``shown_text``): masking is linear, not free.
"""

from __future__ import annotations

import json
import re
import string
from typing import Any

MASK = "***"

# Names that mark a secret. A strong name is a secret at the end of any key (PGPASSWORD,
# client_secret, authtoken), or followed by a variant's suffix (password_confirmation,
# api_key_2); a weak one only as a whole word or after _ - . (db_pass, but not bypass). A
# name marks a secret only at the END of a key: max_tokens, token_count, author,
# passwordless and secretary are not secrets.
# Each alternative starts with a literal letter, so the engine jumps from one possible first
# letter to the next instead of trying every position (text is lowercased for KEY_VALUE).
_STRONG = (r"pass(?:word|wd|phrase)s?", "secrets?", "token", "credentials?", "cookies?",
           "session[_-]?id", "authorization", "jwt", "api[_-]?key", "access[_-]?key",
           "secret[_-]?key", "private[_-]?key")
_WEAK = tuple(rf"{name}(?<![a-z0-9]{name})" for name in ("pwd", "pass", "auth", "session", "sig"))
_SUFFIX = r"(?:[_.-]?(?:confirm(?:ation)?|again|repeat|old|new|[0-9]{1,2}))?"
_NAME = f"(?:{'|'.join(_WEAK + _STRONG)}){_SUFFIX}"

# A dict key whose value is masked wherever it appears in args, results and metadata.
SENSITIVE_KEY = re.compile(rf"(?i){_NAME}\Z")
_KEY_TAIL = 40  # the longest name plus its boundary fits in this many trailing characters

# scheme://user:password@host: the anchor. The password may hold / and @ (generated ones do),
# so where it ends is decided in _mask_urls, within the text up to the next ://.
URL_PASSWORD = re.compile(r"://(?<=[A-Za-z0-9+.-]://)(?P<user>[^\s:/@?#\"'<>]{0,256}):")
_URL_END = re.compile(r"[\s\"'<>]")

# name = value, name: value, 'name': 'value', "name": "value", name='value'; an
# "Authorization: Bearer x" keeps its scheme. None/null and empty values are not secrets.
# Matched against the text with A-Z lowercased (same length, so the offsets hold).
_AUTH_SCHEME = r"(?:bearer|basic|token|digest|negotiate)[ \t]+"
KEY_VALUE = re.compile(
    rf"""(?P<name>{_NAME})
    ['"]?[ \t]{{0,8}}(?:=(?![=>~])|:(?![:=/]))[ \t]{{0,8}}
    (?:
        "(?P<scheme1>{_AUTH_SCHEME})?(?P<dq>[^"\\\n]*(?:\\.[^"\\\n]*)*)
      | '(?P<scheme2>{_AUTH_SCHEME})?(?P<sq>[^'\\\n]*(?:\\.[^'\\\n]*)*)
      | (?!(?:none|null|nil)\b)(?P<scheme3>{_AUTH_SCHEME})?(?P<bare>[^\s&;,'"<>(){{}}\[\]]+)
    )""",
    re.VERBOSE,
)
# KEY_VALUE's groups for a value: (its scheme's group, the value's group), double-quoted,
# single-quoted, bare.
_VALUE_GROUPS = (("scheme1", "dq"), ("scheme2", "sq"), ("scheme3", "bare"))
_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
# A bearer token on its own ("-H 'Bearer eyJ...'"): long enough not to be prose.
BEARER = re.compile(r"Bearer[ \t]+(?P<value>[A-Za-z0-9._~+/=-]{16,})")


def _mask_urls(text: str) -> str:
    if "@" not in text:
        return text  # no userinfo anywhere: one pass in C instead of a look at each ://
    out: list[str] = []
    done = 0
    for m in URL_PASSWORD.finditer(text):
        start = m.end()  # just after user:
        if start < done:
            continue
        # The userinfo ends at the last @ before the URL's end: whitespace or a quote, the
        # next URL, or a ? or # after the first @ (an @ in a query is not the password's).
        nxt = text.find("://", start)
        limit = len(text) if nxt < 0 else nxt
        end_m = _URL_END.search(text, start, limit)
        end = end_m.start() if end_m else limit
        first_at = text.find("@", start, end)
        if first_at < 0:
            continue
        for sep in "?#":
            cut = text.find(sep, first_at, end)
            if cut >= 0:
                end = cut
        at = text.rfind("@", start, end)
        if at == start:  # user:@host, nothing to hide
            continue
        out += [text[done:start], MASK]
        done = at
    if not out:
        return text
    out.append(text[done:])
    return "".join(out)


def _mask_pairs(text: str) -> str:
    if "=" not in text and ":" not in text:
        return text
    out: list[str] = []
    done = 0
    for m in KEY_VALUE.finditer(text.translate(_LOWER)):
        scheme, value = next((s, v) for s, v in _VALUE_GROUPS if m.start(v) >= 0)
        start, end = m.span(value)
        if start == end or text.startswith(MASK, start):
            continue  # empty, or masked already (token:***@host after _mask_urls)
        out += [text[done: m.end(scheme) if m.start(scheme) >= 0 else start], MASK]
        done = end
    if not out:
        return text
    out.append(text[done:])
    return "".join(out)


def _mask_bearer(m: re.Match[str]) -> str:
    if m.start() > 0 and m.string[m.start() - 1].isalnum():
        return m[0]
    return m[0][: m.start("value") - m.start()] + MASK


def mask_text(text: str) -> str:
    """``text`` with every secret found in it replaced by ***: URL passwords, secret-named
    ``key=value`` / ``key: value`` pairs (query strings, libpq, env files, reprs, JSON) and
    Authorization credentials."""
    text = _mask_urls(text)
    text = _mask_pairs(text)
    return BEARER.sub(_mask_bearer, text)


def is_secret_key(key: str) -> bool:
    """True if a value under this key is a secret (``password``, ``db_password``, ``api-key``)."""
    return SENSITIVE_KEY.search(key[-_KEY_TAIL:]) is not None


def redact(value: Any) -> Any:
    """A copy of a JSON value with sensitive keys' values masked and secrets in text hidden."""
    if isinstance(value, dict):
        return {k: (MASK if isinstance(k, str) and is_secret_key(k) and v not in (None, "")
                    else redact(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return mask_text(value)
    return value


# A secret that starts in the part shown and ends in this margin is still recognised. Only a
# URL's password (which ends at its @) or a bearer token cut short could otherwise show in part.
_MARGIN = 1024


def shown_text(text: str, limit: int, *, say_cut: bool = True) -> str:
    """``text`` as a screen shows it: at most ``limit`` characters, secrets masked, and a note
    of how many were cut (or just an ellipsis, without ``say_cut``). Only the part shown and a
    margin are scanned, so a huge value costs no more than a small one."""
    if len(text) <= limit:
        return mask_text(text)
    masked = mask_text(text[: limit + _MARGIN])[:limit]
    return f"{masked}… [{len(text) - limit:,} more characters]" if say_cut else f"{masked}…"


def redact_keys(value: Any) -> Any:
    """``redact`` without masking text: only secret keys' values. For a value about to be
    clipped, whose text is masked after (``shown_json``)."""
    if isinstance(value, dict):
        return {k: (MASK if isinstance(k, str) and is_secret_key(k) and v not in (None, "")
                    else redact_keys(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_keys(v) for v in value]
    return value


def shown_json(value: Any, limit: int, *, indent: int | None = None,
               separators: tuple[str, str] | None = None, say_cut: bool = True) -> str:
    """A JSON value as a screen shows it: secret keys' values masked, then the text clipped to
    ``limit`` characters, then secrets in what is left masked."""
    text = json.dumps(redact_keys(value), ensure_ascii=False, indent=indent, separators=separators)
    return shown_text(text, limit, say_cut=say_cut)
