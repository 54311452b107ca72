"""The job model: states, the Job record a caller sees, and the error records kept per attempt."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class JobState(StrEnum):
    """Where a job is in its lifecycle. A ``str``: ``JobState.DEAD == "dead"``.

    ``scheduled`` → ``available`` → ``running`` → one of the final states ``succeeded``,
    ``dead`` or ``cancelled``; a failed attempt goes back to ``scheduled`` (or ``available``)
    while attempts remain.
    """

    SCHEDULED = "scheduled"
    """Waiting for its ``run_at``: a delay, or a retry's backoff."""
    AVAILABLE = "available"
    """Due; the next free worker slot on its queue takes it."""
    RUNNING = "running"
    """Leased by one worker until ``lease_expires_at``, extended by heartbeat."""
    SUCCEEDED = "succeeded"
    """Done; ``result`` holds the task's return value. Kept for the app's ``result_ttl``."""
    DEAD = "dead"
    """Failed for good (the dead-letter queue): kept with every attempt's error until redriven or purged."""
    CANCELLED = "cancelled"
    """Cancelled before it finished; it will not run (again)."""

    @property
    def is_final(self) -> bool:
        """True for ``succeeded``, ``dead`` and ``cancelled``: nothing moves the job on by itself."""
        return self in FINAL_STATES


FINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED})
WAITING_STATES = frozenset({JobState.SCHEDULED, JobState.AVAILABLE})
UNFINISHED_STATES = frozenset({JobState.SCHEDULED, JobState.AVAILABLE, JobState.RUNNING})


@dataclass(frozen=True)
class Job:
    """A snapshot of one job as the store holds it. Times are unix seconds from the store's clock."""

    id: int
    task: str
    queue: str
    args: dict[str, Any]
    state: JobState
    attempts: int
    max_attempts: int
    priority: int
    run_at: float
    timeout: float
    created_at: float
    attempted_at: float | None = None
    finished_at: float | None = None
    result: Any = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    unique_key: str | None = None
    worker_id: str | None = None
    lease_token: str | None = field(default=None, repr=False)
    lease_expires_at: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    fair_key: str | None = None
    # Exactly-once steps this job has recorded (JobContext.once): step name -> its result.
    steps: dict[str, Any] = field(default_factory=dict)

    @property
    def is_final(self) -> bool:
        return self.state.is_final

    @property
    def last_error(self) -> dict[str, Any] | None:
        return self.errors[-1] if self.errors else None

    def run_at_datetime(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.run_at, tz=dt.UTC)
