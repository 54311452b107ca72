"""How much a dashboard token could be guessed: a cautious entropy estimate, no word list."""

from __future__ import annotations

import math
import re
import string

_WORD = re.compile(r"[a-z]{4,}|[A-Z]{4,}")  # a run of letters of one case: maybe a word


def token_bits(token: str) -> float:
    """A cautious estimate of the entropy in ``token`` (the first 128 characters).

    Each character is worth log2 of the alphabet its classes suggest (digits, hex, letters of
    each case, ``-_`` as in ``secrets.token_urlsafe``, other symbols), except: a repeat of an
    earlier stretch of 4+ characters (``abcdabcd``, ``aaaa``) costs one character whatever its
    length; the fifth character of a run (``12345``, ``abcde``) and on adds nothing; and
    when all the letters are of one case, letters in runs of 4+ count 2 bits each (words:
    ``correct-horse-battery-staple``). Random tokens mix case, so that rule spares them; it
    does not see capitalized words (``CorrectHorseBattery``)."""
    token = token[:128]
    if not token:
        return 0.0
    if token.isdigit():
        pool = 10
    elif all(c in string.hexdigits for c in token):
        pool = 16
    else:
        symbols = {c for c in token if not c.isalnum()}
        symbol_pool = 2 if symbols <= {"-", "_"} else 33
        pool = (26 * any(c.islower() for c in token) + 26 * any(c.isupper() for c in token)
                + 10 * any(c.isdigit() for c in token) + symbol_pool * bool(symbols))
    per_char = math.log2(max(pool, 2))
    one_case = token.lower() == token or token.upper() == token
    words: set[int] = set()
    if one_case and pool != 16:
        words = {i for m in _WORD.finditer(token) for i in range(m.start(), m.end())}
    bits, i, run, step = 0.0, 0, 0, None
    while i < len(token):
        repeat = _repeat_length(token, i)
        if repeat >= 4:
            bits += per_char
            i += repeat
            run, step = 0, None
            continue
        delta = ord(token[i]) - ord(token[i - 1]) if i else None
        if delta is not None and abs(delta) <= 1 and delta == step:
            run += 1
        else:
            run = 1 if delta is not None and abs(delta) <= 1 else 0
        step = delta
        if run < 4:
            bits += min(per_char, 2.0) if i in words else per_char
        i += 1
    return bits


def _repeat_length(token: str, i: int) -> int:
    """How long the stretch starting at ``i`` repeats one that starts earlier (may overlap)."""
    length = 0
    while i + length < len(token) and token.find(token[i:i + length + 1], 0, i + length) != -1:
        length += 1
    return length
