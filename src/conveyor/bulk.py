"""Bulk actions on the jobs a filter selects, in bounded batches.

The walk is built on ``list_jobs`` pages (newest first) and the store's many-id writes
(``redrive``, ``purge``, ``make_due``, ``cancel_many``); nothing here writes a job itself.
One call of :func:`run_batch` looks at a bounded number of jobs and acts on at most ``limit``
of them, then hands back a cursor: the caller (the CLI, the dashboard) calls again until no
cursor is left. Jobs enqueued after the first call have larger ids than the cursor: a bulk
action acts on what the filter selected when it began.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Literal

from .errorgroups import key_of
from .job import FINAL_STATES, UNFINISHED_STATES, Job, JobState

if TYPE_CHECKING:
    from .backends.base import Backend

BULK_BATCH = 500  # jobs one call acts on, by default
PAGE = 500  # jobs per list_jobs page of the walk
COUNT_SCAN = 50_000  # jobs a count looks at before it says "at least"


class BulkAction(StrEnum):
    RETRY = "retry"  # dead: redrive; scheduled after a failure: due now
    RUN_NOW = "run_now"  # scheduled: due now
    CANCEL = "cancel"  # unfinished (a waiting job's cancel cascades, in the store)
    DELETE = "delete"  # finished

    def applies_to(self, job: Job) -> bool:
        if self is BulkAction.RETRY:
            return job.state is JobState.DEAD or (job.state is JobState.SCHEDULED
                                                  and bool(job.errors))
        if self is BulkAction.RUN_NOW:
            return job.state is JobState.SCHEDULED
        if self is BulkAction.CANCEL:
            return job.state in UNFINISHED_STATES
        return job.state in FINAL_STATES


@dataclass(frozen=True)
class JobFilter:
    """Which jobs: every field given must match. ``since``/``until`` bound ``time_field``
    (``created_at`` or ``finished_at``; a job without that time never matches a bound);
    ``error_group`` is an ErrorGroup key (the job's last error); ``search`` a text the job's
    arguments, unique key or error messages contain (case-insensitive)."""

    state: JobState | None = None
    queue: str | None = None
    task: str | None = None
    error_group: str | None = None
    since: float | None = None
    until: float | None = None
    time_field: Literal["created_at", "finished_at"] = "created_at"
    search: str | None = None

    def matches(self, job: Job) -> bool:
        if self.state is not None and job.state is not self.state:
            return False
        if self.queue is not None and job.queue != self.queue:
            return False
        if self.task is not None and job.task != self.task:
            return False
        if self.since is not None or self.until is not None:
            at = job.created_at if self.time_field == "created_at" else job.finished_at
            if at is None:
                return False
            if self.since is not None and at < self.since:
                return False
            if self.until is not None and at >= self.until:
                return False
        if self.error_group is not None and key_of(job) != self.error_group:
            return False
        if self.search:
            from .dashboard.search import job_text  # the dashboard's own text search

            if self.search.lower() not in job_text(job):
                return False
        return True


@dataclass(frozen=True)
class BulkResult:
    """One batch: ``done`` jobs acted on (of ``matched`` the batch selected: a job that changed
    meanwhile is skipped), ``looked`` at, and the cursor to go on from (None: finished)."""

    done: int
    matched: int
    looked: int
    cursor: int | None

    @property
    def more(self) -> bool:
        return self.cursor is not None


def select(backend: Backend, action: BulkAction, where: JobFilter, *, limit: int,
           cursor: int | None, scan: int) -> tuple[list[Job], int, int | None]:
    """Up to ``limit`` jobs the action applies to, looking at no more than ``scan`` jobs from
    ``cursor``: (jobs, looked, the cursor to go on from, or None at the end)."""
    chosen: list[Job] = []
    looked = 0
    last: int | None = cursor
    state_cursor = cursor
    while looked < scan:
        page = backend.list_jobs(state=where.state, queue=where.queue, task=where.task,
                                 cursor=state_cursor, limit=min(PAGE, scan - looked))
        # A page cut short by the store's own budget (Redis) still counts as looked at.
        looked += max(0, PAGE // 4 - len(page.jobs))
        for job in page.jobs:
            looked += 1
            last = job.id
            if where.matches(job) and action.applies_to(job):
                chosen.append(job)
                if len(chosen) == limit:
                    return chosen, looked, job.id
        if page.next_cursor is None:
            return chosen, looked, None
        state_cursor = last = page.next_cursor
    return chosen, looked, last


def run_batch(backend: Backend, action: BulkAction, where: JobFilter, *, limit: int = BULK_BATCH,
              cursor: int | None = None, now: float | None = None) -> BulkResult:
    """See ``Backend.bulk``."""
    if limit <= 0:
        raise ValueError("limit must be positive")
    jobs, looked, next_cursor = select(backend, action, where, limit=limit, cursor=cursor,
                                       scan=max(limit * 4, 2000))
    done = act(backend, action, jobs, now=now)
    return BulkResult(done=done, matched=len(jobs), looked=looked, cursor=next_cursor)


def act(backend: Backend, action: BulkAction, jobs: list[Job], *, now: float | None) -> int:
    """Apply ``action`` to ``jobs`` through the store's many-id writes: ``redrive``,
    ``make_due``, ``cancel_many`` (with its cascade) and ``purge`` each take the whole batch in
    one atomic write (``purge`` one per final state), so a crash leaves a batch done or not."""
    if not jobs:
        return 0
    if action is BulkAction.CANCEL:
        return len(backend.cancel_many([j.id for j in jobs], now=now))
    if action is BulkAction.DELETE:
        done = 0
        for state in (JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED):
            ids = [j.id for j in jobs if j.state is state]
            if ids:
                done += backend.purge(state=state, job_ids=ids)
        return done
    due = [j.id for j in jobs if j.state is JobState.SCHEDULED]
    done = backend.make_due(due, now=now) if due else 0
    dead = [j.id for j in jobs if j.state is JobState.DEAD]
    if dead:
        done += backend.redrive(dead, now=now)
    return done


def count(backend: Backend, action: BulkAction, where: JobFilter,
          scan: int = COUNT_SCAN) -> tuple[int, bool]:
    """How many jobs the action would take now: (count, exact). Looks at no more than ``scan``
    jobs; past that the count is a lower bound (exact is False)."""
    n, cursor, looked = 0, None, 0
    while looked < scan:
        jobs, seen, cursor = select(backend, action, where, limit=PAGE, cursor=cursor,
                                    scan=min(scan - looked, PAGE * 4))
        n += len(jobs)
        looked += seen
        if cursor is None:
            return n, True
    return n, False
