"""``sqs://`` URLs and the names of Conveyor's lanes as SQS queues.

A URL names the endpoint, the region and the queue names' prefix::

    sqs://                                  AWS itself: boto3's region and credential chain
    sqs://127.0.0.1:4566/?region=us-east-1  an SQS-compatible server (http; secure=true: https)
    sqs://KEY:SECRET@host:port/             credentials in the URL (for local servers)

Options: ``region``, ``prefix`` (default ``conveyor``), ``levels`` (priority levels, e.g.
``-1,0,1``; default ``0``), ``max_receives`` (the redrive policy's maxReceiveCount, default 20),
``profile`` (a profile of the AWS config files), ``secure``, ``timeout`` (seconds per request,
default 10), ``fifo`` (FIFO queues: deduplication by ``unique_key`` and message groups by
``fair_key``; see sqs.py).

SQS queue names take ``A-Z a-z 0-9 _ -`` and at most 80 characters; Conveyor's queue names also
take ``.``, ``:``, ``{`` and ``}``. A lane is ``{prefix}-{queue}-p{level}`` (``pm1`` for level
-1) and a dead lane ``{prefix}-{queue}-dead``, with the queue name escaped reversibly (``_`` is
``__``, ``.`` is ``_d``, ``:`` is ``_c``, ``{`` is ``_l``, ``}`` is ``_r``), so ``queues()``
reads the Conveyor names back from the broker.
With ``fifo=true`` every lane's name ends in ``.fifo`` (SQS's rule for a FIFO queue) and each
job lane has a standard queue for its delayed messages, ``{prefix}-{queue}-p{level}-delay``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlsplit

from ...errors import ConfigurationError, InvalidName
from ...payload import QUEUE_NAME_RE, check_queue_name

NAME_MAX = 80
PREFIX_RE = re.compile(r"[A-Za-z0-9_]{1,40}")
_ESCAPE = {"_": "__", ".": "_d", ":": "_c", "{": "_l", "}": "_r"}
_UNESCAPE = {"_": "_", "d": ".", "c": ":", "l": "{", "r": "}"}
_SUFFIX_RE = re.compile(r"-(dead|p(m?)([0-9]+))$")
_OPTIONS = {"region", "prefix", "levels", "max_receives", "profile", "secure", "timeout", "fifo"}
FIFO = ".fifo"
DELAY = "-delay"
# Room a FIFO lane's names keep for the longer of their two endings, so that a queue name
# fits all of its lanes or none.
_FIFO_ROOM = max(len(FIFO), len(DELAY))


@dataclass(frozen=True)
class SqsSettings:
    endpoint: str | None  # None: AWS's own, from the region
    region: str | None  # None: boto3's chain (AWS_REGION, the config file)
    prefix: str
    levels: tuple[int, ...]
    max_receives: int
    timeout: float
    profile: str | None = None
    access_key: str | None = None
    secret_key: str | None = None
    fifo: bool = False

    @property
    def where(self) -> str:
        """The endpoint, for messages."""
        return self.endpoint or f"AWS ({self.region or 'default region'})"


def parse_sqs_url(url: str) -> SqsSettings:
    parts = urlsplit(url)
    if parts.scheme != "sqs":
        raise ConfigurationError(f"not an sqs:// URL: {url!r}")
    if parts.path not in ("", "/"):
        raise ConfigurationError(
            f"an sqs:// URL has no path (queues are named by the prefix option): {parts.path!r}")
    opts = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(opts) - _OPTIONS)
    if unknown:
        raise ConfigurationError(f"unknown sqs:// option(s) {', '.join(unknown)}: "
                                 f"expected {', '.join(sorted(_OPTIONS))}")
    secure = _flag(opts.get("secure", "false"), "secure")
    endpoint = None
    if parts.hostname:
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        try:
            port = parts.port
        except ValueError as exc:
            raise ConfigurationError(f"sqs:// URL: {exc}") from None
        endpoint = f"{'https' if secure else 'http'}://{host}" + (f":{port}" if port else "")
    prefix = opts.get("prefix", "conveyor")
    if not PREFIX_RE.fullmatch(prefix):
        # No "-": it separates the prefix from the queue, so two prefixes never share a name.
        raise ConfigurationError(
            f"sqs:// prefix {prefix!r}: use 1-40 characters from A-Z a-z 0-9 _ (no -)")
    try:
        levels = tuple(int(v) for v in opts.get("levels", "0").split(","))
    except ValueError:
        raise ConfigurationError(
            f"sqs:// levels {opts['levels']!r}: integers separated by commas, e.g. -1,0,1"
        ) from None
    region = opts.get("region") or None
    if region is None and endpoint is not None:
        region = "us-east-1"  # a local server ignores it, but boto3 needs one to sign requests
    return SqsSettings(
        endpoint=endpoint, region=region, prefix=prefix, levels=levels,
        max_receives=_int(opts.get("max_receives", "20"), "max_receives", 1, 1000),
        timeout=_float(opts.get("timeout", "10"), "timeout"),
        profile=opts.get("profile") or None,
        access_key=unquote(parts.username) if parts.username else None,
        secret_key=unquote(parts.password) if parts.password else None,
        fifo=_flag(opts.get("fifo", "false"), "fifo"),
    )


def _flag(value: str, name: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off", ""):
        return False
    raise ConfigurationError(f"sqs:// option {name}={value!r}: expected true or false")


def _int(value: str, name: str, low: int, high: int) -> int:
    try:
        n = int(value)
    except ValueError:
        n = low - 1
    if not low <= n <= high:
        raise ConfigurationError(f"sqs:// option {name}={value!r}: an integer {low}-{high}")
    return n


def _float(value: str, name: str) -> float:
    try:
        x = float(value)
    except ValueError:
        x = 0.0
    if not x > 0:
        raise ConfigurationError(f"sqs:// option {name}={value!r}: a number of seconds > 0")
    return x


def escape(queue: str) -> str:
    return "".join(_ESCAPE.get(ch, ch) for ch in queue)


def unescape(text: str) -> str | None:
    """The queue name ``escape`` made ``text`` from; None if it made none."""
    out = []
    chars = iter(text)
    for ch in chars:
        if ch == "_":
            ch = _UNESCAPE.get(next(chars, ""), "")
            if not ch:
                return None
        out.append(ch)
    return "".join(out)


def lane_name(prefix: str, queue: str, level: int | None, *, fifo: bool = False,
              delay: bool = False) -> str:
    """The SQS queue of a lane: ``level`` None is the dead lane. With ``fifo`` the FIFO queue,
    or with ``delay`` too the standard queue that holds the job lane's delayed messages."""
    check_queue_name(queue)
    suffix = "dead" if level is None else f"p{level}" if level >= 0 else f"pm{-level}"
    base = f"{prefix}-{escape(queue)}-{suffix}"
    room = _FIFO_ROOM if fifo else 0
    if len(base) + room > NAME_MAX:
        raise InvalidName(
            f"queue {queue!r} is too long for SQS: its lane {base!r} has {len(base)} characters, "
            f"SQS allows {NAME_MAX}{f' less {room} for the FIFO endings' if room else ''} "
            "(shorten the queue name or the prefix; '_', '.', ':', '{' and '}' take two "
            "characters each)")
    if not fifo:
        return base
    if delay:
        if level is None:
            raise ValueError("the dead lane has no delay queue")
        return base + DELAY
    return base + FIFO


def parse_lane_name(prefix: str, name: str, *,
                    fifo: bool = False) -> tuple[str, int | None] | None:
    """(queue, level) of a lane's SQS name, level None for the dead lane; None if the name is
    not one of this prefix's lanes (of the FIFO kind with ``fifo``, else the standard kind)."""
    if name.endswith(FIFO) != fifo or not name.startswith(f"{prefix}-"):
        return None
    if fifo:
        name = name[:-len(FIFO)]
    match = _SUFFIX_RE.search(name)
    if match is None:
        return None
    queue = unescape(name[len(prefix) + 1:match.start()])
    if queue is None or not QUEUE_NAME_RE.fullmatch(queue):
        return None
    if match.group(1) == "dead":
        return queue, None
    level = int(match.group(3))
    return queue, -level if match.group(2) else level
