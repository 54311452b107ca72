"""Dead and failed jobs grouped by cause: (task, error type, normalised message).

A message is normalised so that one cause is one group: the parts that differ from one job to
the next (ids, numbers, quoted values) become placeholders. ``group_key`` names a group with a
short stable hash, so a page can link to it (``/errors/<key>``) and a filter can select it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .job import Job

MESSAGE_CHARS = 1000  # of a message read for grouping: a huge message costs no more than this
SHOWN_CHARS = 200  # of a normalised message kept as the group's text

# Order matters: a uuid holds hex digits and numbers, a quoted value may hold anything.
_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I),
     "<uuid>"),
    # A quote opens only where no word character comes before it: "can't" is no quoted value.
    (re.compile(r"(?<!\w)'[^'\n]{0,200}'|(?<!\w)\"[^\"\n]{0,200}\""), "<str>"),
    (re.compile(r"\b0x[0-9a-f]+\b", re.I), "<hex>"),
    # Hex ids (hashes, object ids): 8 or more hex digits with a digit and a letter among them.
    (re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b", re.I), "<hex>"),
    (re.compile(r"\d+(?:\.\d+)?"), "<n>"),
    (re.compile(r"\s+"), " "),
)


def normalise(message: str) -> str:
    """``message`` with what varies per job replaced: uuids by ``<uuid>``, quoted values by
    ``<str>``, hex ids by ``<hex>``, numbers by ``<n>``; whitespace runs by one space."""
    text = message[:MESSAGE_CHARS]
    for pattern, placeholder in _RULES:
        text = pattern.sub(placeholder, text)
    return text.strip()[:SHOWN_CHARS]


def group_key(task: str, error_type: str, message: str) -> str:
    """The stable name of a group: 16 hex digits of a hash of its three parts (the message
    already normalised)."""
    raw = "\0".join((task, error_type, message)).encode("utf-8", "surrogatepass")
    return hashlib.sha256(raw).hexdigest()[:16]


def last_error_of(job: Job) -> dict[str, Any] | None:
    return job.errors[-1] if job.errors else None


def key_of(job: Job) -> str | None:
    """The group key of the job's last error, or None for a job that has not failed."""
    err = last_error_of(job)
    if err is None:
        return None
    return group_key(job.task, str(err.get("type") or ""),
                     normalise(str(err.get("message") or "")))


@dataclass(frozen=True)
class ErrorGroup:
    """Jobs whose last error has one cause. ``first_seen``/``last_seen``: the earliest and
    latest time one of them failed with it (unix seconds); ``sample_id``: the newest job."""

    key: str
    task: str
    error_type: str
    message: str  # normalised
    count: int
    first_seen: float
    last_seen: float
    sample_id: int


@dataclass(frozen=True)
class ErrorGroups:
    """What ``Backend.error_groups`` returns: the groups, most jobs first, and how many jobs
    were looked at. ``complete`` is False when the bound stopped the count: the counts are of
    the jobs looked at (the newest), not of all."""

    groups: list[ErrorGroup]
    scanned: int
    complete: bool

    def find(self, key: str) -> ErrorGroup | None:
        return next((g for g in self.groups if g.key == key), None)


class Grouper:
    """Adds up raw rows (task, type, message, count, first, last, sample id) into groups. The
    stores' SQL hands it one row per distinct raw message; a walk hands it one per job."""

    def __init__(self) -> None:
        self._groups: dict[str, list[Any]] = {}
        self.scanned = 0

    def add(self, task: str, error_type: str | None, message: str | None, count: int,
            first: float | None, last: float | None, sample_id: int) -> None:
        self.scanned += count
        etype = str(error_type or "")
        text = normalise(str(message or ""))
        key = group_key(task, etype, text)
        first_at = float(first) if first is not None else 0.0
        last_at = float(last) if last is not None else first_at
        g = self._groups.get(key)
        if g is None:
            self._groups[key] = [task, etype, text, count, first_at, last_at, sample_id]
            return
        g[3] += count
        g[4] = min(g[4], first_at)
        g[5] = max(g[5], last_at)
        g[6] = max(g[6], sample_id)

    def add_jobs(self, jobs: Iterable[Job]) -> None:
        for job in jobs:
            err = last_error_of(job)
            if err is None:
                continue
            at = err.get("at")
            when = float(at) if isinstance(at, int | float) else job.finished_at
            self.add(job.task, err.get("type"), err.get("message"), 1, when, when, job.id)

    def result(self, limit: int, complete: bool) -> ErrorGroups:
        groups = [ErrorGroup(key, g[0], g[1], g[2], g[3], g[4], g[5], g[6])
                  for key, g in self._groups.items()]
        groups.sort(key=lambda g: (-g.count, -g.last_seen, g.key))
        return ErrorGroups(groups[:limit], self.scanned, complete)
