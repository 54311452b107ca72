"""Reading the dashboard's query strings and forms: each value checked, or a BadRequest the
page shows as a 400 with its reason."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..job import JobState
from ..payload import QUEUE_NAME_RE, TASK_NAME_RE

PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
MAX_QUERY = 256
MAX_IDS = 1000


class BadRequest(Exception):
    """A parameter the page cannot use; shown to the user as a 400 with this message."""


@dataclass
class JobsQuery:
    state: JobState | None = None
    queue: str | None = None
    task: str | None = None
    q: str = ""
    cursor: int | None = None
    limit: int = PAGE_SIZE

    def params(self, **override: Any) -> dict[str, str]:
        values: dict[str, Any] = {"state": self.state.value if self.state else None,
                                  "queue": self.queue, "task": self.task, "q": self.q or None,
                                  "cursor": self.cursor,
                                  "limit": self.limit if self.limit != PAGE_SIZE else None}
        values.update(override)
        return {k: str(v) for k, v in values.items() if v not in (None, "")}



def one(params: Any, name: str) -> str:
    value = params.get(name)
    return value.strip() if isinstance(value, str) else ""


def parse_state(value: str) -> JobState | None:
    if not value:
        return None
    try:
        return JobState(value)
    except ValueError:
        states = ", ".join(s.value for s in JobState)
        raise BadRequest(f"unknown state {value!r}: one of {states}") from None


def parse_queue(value: str) -> str | None:
    if not value:
        return None
    if not QUEUE_NAME_RE.fullmatch(value):
        raise BadRequest("a queue name is 1-128 characters of letters, digits and _ . : - { }")
    return value


def parse_task(value: str) -> str | None:
    if not value:
        return None
    if not TASK_NAME_RE.fullmatch(value):
        raise BadRequest("a task name is 1-255 characters of letters, digits and _ . : < > -")
    return value


def parse_cursor(value: str) -> int | None:
    if not value:
        return None
    if not value.isdigit() or len(value) > 18:
        raise BadRequest("cursor must be a job id")
    return int(value)


def parse_limit(value: str) -> int:
    if not value:
        return PAGE_SIZE
    if not value.isdigit():
        raise BadRequest("limit must be a number")
    return max(1, min(MAX_PAGE_SIZE, int(value[:6])))


def parse_jobs_query(params: Any) -> JobsQuery:
    q = one(params, "q")
    if len(q) > MAX_QUERY:
        raise BadRequest(f"search text is limited to {MAX_QUERY} characters")
    return JobsQuery(state=parse_state(one(params, "state")),
                     queue=parse_queue(one(params, "queue")),
                     task=parse_task(one(params, "task")), q=q,
                     cursor=parse_cursor(one(params, "cursor")),
                     limit=parse_limit(one(params, "limit")))


def parse_ids(values: Sequence[str]) -> list[int]:
    if len(values) > MAX_IDS:
        raise BadRequest(f"at most {MAX_IDS} jobs per action")
    ids = []
    for v in values:
        if not v.strip().isdigit() or len(v.strip()) > 18:
            raise BadRequest(f"not a job id: {v[:40]!r}")
        ids.append(int(v))
    return sorted(set(ids), reverse=True)


def safe_next(value: str, default: str) -> str:
    """A path inside the dashboard to go back to; anything else (another site) is ignored."""
    if (not value or not value.startswith("/") or value.startswith("//") or "\\" in value
            or any(ord(c) < 32 for c in value) or len(value) > 2000):
        return default
    return value

