"""The cron page's rows, read defensively: ``app.schedules`` (name -> Schedule with
``name, expression, timezone, task, queue`` and ``next_run(after: datetime) -> datetime``) and
``backend.cron_states()`` (schedule name -> CronState: the last tick taken, the job of the
latest tick that made one, disabled or not), with that job read by ``backend.get``. An app
without schedules gives an empty page with a note, never an error."""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any

from ..app import Conveyor
from ..backends.base import Backend
from ..job import Job

log = logging.getLogger("conveyor.dashboard")


@dataclass
class CronRow:
    name: str
    expression: str
    timezone: str
    task: str
    queue: str
    last_tick: float | None
    next_run: float | None
    late: bool  # a tick after the last one recorded is overdue by more than a minute
    problem: str = ""
    disabled_at: float | None = None
    last_job_id: int | None = None
    last_job: Job | None = None  # None with a last_job_id: no longer in the store (pruned)


def _next_after(schedule: Any, ts: float) -> float | None:
    next_run = getattr(schedule, "next_run", None)
    if not callable(next_run):
        return None
    when = next_run(dt.datetime.fromtimestamp(ts, tz=dt.UTC))
    if isinstance(when, dt.datetime):
        return when.timestamp()
    return float(when) if isinstance(when, int | float) else None


def cron_rows(app: Conveyor, backend: Backend, now: float) -> tuple[list[CronRow], str]:
    schedules = getattr(app, "schedules", None) or {}
    note = ""  # every store records cron states (Backend.cron_states is abstract)
    states = backend.cron_states()
    rows = []
    for name in sorted(schedules):
        s = schedules[name]
        state = states.get(name)
        last = state.last_tick if state is not None else None
        row = CronRow(name=str(getattr(s, "name", name)),
                      expression=str(getattr(s, "expression", "?")),
                      timezone=str(getattr(s, "timezone", "UTC")),
                      task=str(getattr(s, "task", "?")), queue=str(getattr(s, "queue", "?")),
                      last_tick=last, next_run=None, late=False)
        if state is not None:
            row.disabled_at, row.last_job_id = state.disabled_at, state.last_job_id
            if state.last_job_id is not None:
                row.last_job = backend.get(state.last_job_id)
        try:
            row.next_run = _next_after(s, now)
            if last is not None and row.disabled_at is None:
                expected = _next_after(s, last)
                row.late = expected is not None and expected < now - 60
        except Exception as exc:  # one broken schedule must not hide the others
            log.warning("dashboard: cron schedule %s: %s", name, exc)
            row.problem = f"{type(exc).__name__}: {exc}"
        rows.append(row)
    if not schedules:
        note = ("No cron schedules are registered on this app. The dashboard shows the schedules "
                "of the app it runs with (conveyor --app module:app dashboard).")
    return rows, note
