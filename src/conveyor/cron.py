"""Cron on the same machinery as every other job: a scheduler turns each tick into one job.

Each worker runs a scheduler (``--no-scheduler`` turns it off). A tick is enqueued through
``Backend.cron_enqueue``, a compare-and-set of the schedule's last tick in the same atomic
operation as the job's write, so however many schedulers run, each tick makes one job.

Policies, stated once:

* Misfires: a scheduler only ever enqueues the latest tick at or before now. After an outage
  the most recent missed tick runs once; older missed ticks are skipped.
* A new schedule starts from the tick before it was first seen: that tick is recorded, not
  run, so deploying a nightly job at 15:00 does not run last night's tick at once.
* Daylight saving: ticks are computed in the schedule's timezone. When clocks go back, a
  wall-clock time that occurs twice fires once (at its first occurrence), unless the hour
  field is ``*``: then ticks follow real time through the repeated hour, as Vixie cron does
  for wildcard jobs. A wall-clock time skipped when clocks go forward fires once, at the
  first valid time after it (croniter's rule).
* The job carries its tick: ``job.meta["cron"] = {"schedule", "tick", "timezone"}`` and
  ``current_job().cron_tick`` (an aware datetime in the schedule's timezone).

Controls, kept in the store so every scheduler, the CLI and the dashboard agree (see
``Backend.set_cron_enabled`` and ``cron_states``):

* A disabled schedule enqueues nothing from any scheduler: the store checks it in the same
  atomic operation that takes a tick, and takes the tick without a job. Enabling it resumes
  from its first tick after that moment: the ticks it missed while disabled never run.
* The store keeps the id of the job of each schedule's latest tick (``last_job_id``).
* :func:`run_now` enqueues a schedule's job at once, outside its tick series: the schedule's
  recorded tick and last job stay as they are, and ``meta["cron"]["manual"]`` is true (its
  ``tick`` is the time it was asked for). It works on a disabled schedule too.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from . import payload, signing
from .backends.base import Backend, EnqueueResult, NewJob
from .errors import ConfigurationError, QueueFull, UnknownSchedule
from .job import Job

if TYPE_CHECKING:
    from .app import Conveyor

log = logging.getLogger("conveyor.cron")

# Repeated wall-clock times skipped in a row. When clocks go back, every tick of the repeated
# period is skipped: "* 1 * * *" has 60 in New York's repeated 01:00-02:00, and an expression with
# a seconds field up to one a second, over at most 2 hours (the largest shift in use).
_SEARCH_LIMIT = 2 * 3600 + 8


def tick_of(job: Job) -> dt.datetime | None:
    """For a job a cron schedule made: the tick it was meant for, in the schedule's timezone."""
    info = job.meta.get("cron")
    if not isinstance(info, dict):
        return None
    try:
        tick = float(info["tick"])
        return dt.datetime.fromtimestamp(tick, ZoneInfo(str(info.get("timezone", "UTC"))))
    except (KeyError, TypeError, ValueError, ZoneInfoNotFoundError):
        return None  # meta written by hand or by another version: no tick to show


@dataclass(frozen=True)
class Schedule:
    """One cron schedule: enqueue ``task`` with ``kwargs`` at every tick of ``expression``."""

    name: str
    expression: str
    task: str
    queue: str
    timezone: str = "UTC"
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    priority: int = 0

    def __post_init__(self) -> None:
        payload.check_queue_name(self.name)
        if not isinstance(self.expression, str) or not croniter.is_valid(self.expression):
            raise ConfigurationError(f"cron schedule {self.name!r}: {self.expression!r} is not a "
                                     "valid cron expression")
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise ConfigurationError(
                f"cron schedule {self.name!r}: unknown timezone {self.timezone!r}") from None

    @property
    def tz(self) -> ZoneInfo:
        """The schedule's time zone."""
        return ZoneInfo(self.timezone)

    @property
    def _follows_real_time(self) -> bool:
        fields = self.expression.split()
        return len(fields) >= 2 and fields[1] == "*"

    def _is_repeat(self, ts: float) -> bool:
        """True for the second occurrence of a wall-clock time repeated when clocks go back."""
        return not self._follows_real_time and dt.datetime.fromtimestamp(ts, self.tz).fold == 1

    def _instant(self, ts: float) -> dt.datetime:
        """``ts`` as a datetime, rounded *down* to the microsecond. fromtimestamp rounds to the
        nearest one, so an instant a fraction of a microsecond before a tick became the tick."""
        secs = math.floor(ts)
        micros = min(999_999, math.floor((ts - secs) * 1_000_000))
        return dt.datetime.fromtimestamp(secs, self.tz).replace(microsecond=micros)

    def latest_tick(self, now: float) -> float:
        """The latest tick at or before ``now`` (unix seconds)."""
        just_after = self._instant(now) + dt.timedelta(microseconds=1)
        it = croniter(self.expression, just_after)
        for _ in range(_SEARCH_LIMIT):
            ts = float(it.get_prev(float))
            if not self._is_repeat(ts):
                break
        else:
            raise ConfigurationError(f"cron schedule {self.name!r}: no tick found before {now}")
        # Inside a repeated hour croniter steps back by wall clock and lands in the first pass
        # of that hour (01:29 EDT from 01:29 EST), before later ticks of it (01:59 EDT): walk on.
        for _ in range(_SEARCH_LIMIT):
            following = self.next_tick(ts)
            if following > now:
                return ts
            ts = following
        raise ConfigurationError(f"cron schedule {self.name!r}: no tick found before {now}")

    def next_tick(self, after: float) -> float:
        """The first tick strictly after ``after`` (unix seconds)."""
        it = croniter(self.expression, self._instant(after))
        for _ in range(_SEARCH_LIMIT):
            ts = float(it.get_next(float))
            if not self._is_repeat(ts):
                return ts
        raise ConfigurationError(f"cron schedule {self.name!r}: no tick found after {after}")

    def next_run(self, after: dt.datetime) -> dt.datetime:
        """The first tick after ``after`` (an aware datetime), in the schedule's timezone."""
        if after.tzinfo is None:
            raise ConfigurationError("next_run needs an aware datetime")
        return dt.datetime.fromtimestamp(self.next_tick(after.timestamp()), self.tz)

    def tick_datetime(self, ts: float) -> dt.datetime:
        """A tick (unix seconds) as an aware datetime in the schedule's time zone."""
        return dt.datetime.fromtimestamp(ts, self.tz)

    def job_for(self, app: Conveyor, tick: float, *, manual: bool = False) -> NewJob:
        """The job of one tick, with the task's defaults, its tick in meta and a unique key.
        ``manual``: a run asked for by hand at ``tick``, marked so in meta, with no unique key
        (each such run is a job of its own) and not tied to the schedule's ticks."""
        task = app.get_task(self.task)
        opts = task._opts
        args = payload.encode(dict(self.kwargs), what=f"kwargs of cron schedule {self.name}",
                              limit=app.max_payload_bytes)
        info: dict[str, Any] = {"schedule": self.name, "tick": tick, "timezone": self.timezone}
        if manual:
            info["manual"] = True
        meta: dict[str, Any] = {"cron": info}
        if app.signer is not None:
            meta[signing.META_KEY] = app.signer.sign(task.name, self.queue, dict(self.kwargs))
        return NewJob(
            task=task.name, queue=self.queue, args=args, max_attempts=opts.max_attempts,
            timeout=opts.timeout, priority=self.priority, run_at=tick,
            unique_key=None if manual else f"cron:{self.name}:{tick:.0f}", meta=json.dumps(meta),
            max_depth=app.max_depths.get(self.queue),
        )


def run_now(app: Conveyor, name: str, *, now: float | None = None) -> EnqueueResult:
    """Enqueue schedule ``name``'s job at once, outside its tick series (see the module's
    notes on controls). Raises UnknownSchedule for a name the app has no schedule of."""
    schedule = app.schedules.get(name)
    if schedule is None:
        raise UnknownSchedule(f"no cron schedule named {name!r} is registered on this app")
    t = app.backend.now() if now is None else now
    [result] = app.backend.enqueue_many([schedule.job_for(app, t, manual=True)], now=now)
    log.info("cron %s: enqueued job %s by hand", name, result.id)
    return result


class Scheduler:
    """Enqueues due ticks of an app's schedules. Safe to run in any number of processes."""

    def __init__(self, app: Conveyor, backend: Backend | None = None) -> None:
        self.app = app
        self.backend = backend or app.backend
        self._taken: dict[str, float] = {}  # the last tick this scheduler saw taken, per schedule

    def run_pending(self, now: float | None = None) -> list[EnqueueResult]:
        """Enqueue every schedule's latest due tick not taken yet; returns the jobs made."""
        schedules = self.app.schedules
        if not schedules:
            return []
        t = self.backend.now() if now is None else now
        due = {name: s.latest_tick(t) for name, s in schedules.items()}
        if all(self._taken.get(name, -math.inf) >= tick for name, tick in due.items()):
            return []
        recorded = self.backend.cron_ticks()
        made: list[EnqueueResult] = []
        for name, tick in sorted(due.items()):
            last = recorded.get(name)
            if last is not None and last >= tick:
                self._taken[name] = last
                continue
            schedule = schedules[name]
            # First sight of a schedule: record its latest tick as the start, don't run it.
            job = schedule.job_for(self.app, tick) if last is not None else None
            try:
                result = self.backend.cron_enqueue(name, tick, job, now=now)
            except QueueFull as exc:
                log.warning("cron %s: tick %s not enqueued, %s; will try again", name,
                            schedule.tick_datetime(tick).isoformat(), exc)
                continue
            self._taken[name] = tick
            if result is not None:
                made.append(result)
                log.info("cron %s: enqueued job %s for tick %s", name, result.id,
                         schedule.tick_datetime(tick).isoformat())
        return made
