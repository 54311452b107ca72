"""What the demo reads from its store: failures to show, the end-of-run summary, and whether
a file may hold the demo at all."""

from __future__ import annotations

import contextlib
import re
import sqlite3
import time
import urllib.parse
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from ..app import Conveyor
from ..errors import ConfigurationError
from ..job import Job, JobState
from . import TASK_PREFIX


def short_task(name: str) -> str:
    return name.removeprefix(TASK_PREFIX)


def call_text(job: Job, limit: int = 40) -> str:
    args = ", ".join(repr(v) for v in job.args.values())
    text = f"{short_task(job.task)}({args})"
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class Event:
    """One failed attempt, read back from a job's stored errors."""

    at: float
    job: Job
    attempt: int
    kind: str
    message: str
    dead: bool


def recent_failures(jobs: Sequence[Job], limit: int) -> list[Event]:
    events: list[Event] = []
    for job in jobs:
        for i, err in enumerate(job.errors):
            final = job.state is JobState.DEAD and i == len(job.errors) - 1
            kind = str(err.get("kind") or "error")
            etype = short_task(str(err.get("type") or ""))
            message = str(err.get("message") or "")
            if kind == "timeout":
                message = f"timed out after {job.timeout:g}s"
            elif etype and kind != "rejected":
                message = f"{etype}: {message}"
            events.append(Event(at=float(err.get("at") or 0.0), job=job,
                                attempt=int(err.get("attempt") or 0), kind=kind, message=message,
                                dead=final))
    events.sort(key=lambda e: (e.at, e.job.id), reverse=True)
    return events[:limit]


@dataclass
class Summary:
    """Counts over every job in the store (read page by page at the end of a run)."""

    by_state: Counter[str] = field(default_factory=Counter)
    succeeded_after_retry: int = 0
    failed_attempts: int = 0
    dead_ids: list[int] = field(default_factory=list)
    dead_by_task: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.by_state.values())


def summarize(conveyor: Conveyor) -> Summary:
    summary = Summary()
    cursor: int | None = None
    while True:
        page = conveyor.backend.list_jobs(cursor=cursor, limit=500)
        for job in page.jobs:
            summary.by_state[str(job.state)] += 1
            summary.failed_attempts += len(job.errors)
            if job.state is JobState.SUCCEEDED and job.attempts >= 2:
                summary.succeeded_after_retry += 1
            if job.state is JobState.DEAD:
                summary.dead_ids.append(job.id)
                summary.dead_by_task[short_task(job.task)] += 1
        if page.next_cursor is None:
            return summary
        cursor = page.next_cursor


# -- the demo run -----------------------------------------------------------------------------
def _store_tables() -> frozenset[str]:
    """The tables a Conveyor SQLite store has: those its migrations create (read from them, so
    a new migration's table is the demo's own at once), and SQLite's own sequence table."""
    folder = resources.files("conveyor.backends.sql").joinpath("sqlite")
    names = {"sqlite_sequence"}
    for f in folder.iterdir():
        if f.name.endswith(".sql"):
            names.update(re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)", f.read_text("utf-8"),
                                    flags=re.I))
    return frozenset(names)


DEMO_TABLES = _store_tables()


def _not_a_demo_store(path: Path) -> str | None:
    """Why ``path`` is not the demo's own store, or None if it is (or is empty)."""
    if path.is_dir():
        return "is a directory"
    if path.stat().st_size == 0:
        return None
    uri = "file:" + urllib.parse.quote(str(path)) + "?mode=ro"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=5)) as conn:
            rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            tables = {r[0] for r in rows}
            if tables - DEMO_TABLES:
                others = ", ".join(sorted(tables - DEMO_TABLES))
                return f"is a SQLite database with other tables ({others})"
            if "conveyor_jobs" in tables:
                row = conn.execute(
                    "SELECT task FROM conveyor_jobs WHERE task NOT LIKE ? LIMIT 1",
                    (f"{TASK_PREFIX}%",),
                ).fetchone()
                if row is not None:
                    return f"holds jobs that are not the demo's (task {row[0]!r})"
    except sqlite3.DatabaseError as exc:
        return f"is not a Conveyor store ({exc})"
    return None


def _live_worker(path: Path) -> str | None:
    """A worker that heartbeat the store at ``path`` in the last 15 s, described; or None."""
    uri = "file:" + urllib.parse.quote(str(path)) + "?mode=ro"
    with (contextlib.suppress(sqlite3.DatabaseError),
          contextlib.closing(sqlite3.connect(uri, uri=True)) as conn):
        row = conn.execute(
            "SELECT id, last_seen FROM conveyor_workers ORDER BY last_seen DESC LIMIT 1"
        ).fetchone()
        if row is not None and time.time() - row[1] < 15:
            return f"worker {row[0]}, last seen {max(0.0, time.time() - row[1]):.0f}s ago"
    return None


def prepare_store(path: Path, *, fresh: bool) -> bool:
    """Check that ``path`` may hold the demo; with ``fresh``, delete an old demo store there.

    The demo only ever deletes or writes to a file that is empty or holds nothing but demo
    jobs: its worker would otherwise claim another app's jobs on high/default/low and kill
    them as unknown tasks. Returns True if an old store was deleted.
    """
    if not path.exists():
        return False
    reason = _not_a_demo_store(path)
    if reason is not None:
        raise ConfigurationError(f"{path} {reason}; the demo will not touch it. Pick another --db.")
    if not fresh:
        return False
    worker = _live_worker(path)
    if worker is not None:
        raise ConfigurationError(
            f"{path} is in use by a running demo ({worker}); not deleting it. "
            "Stop that demo, pick another --db, or pass --keep to join it."
        )
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return True

