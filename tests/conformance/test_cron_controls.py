"""Cron controls kept in the store, the same on every backend: disable and enable a schedule
(honoured by every scheduler, inside the atomic tick), the last run's job per schedule, and
running a schedule now, outside its tick series."""

from __future__ import annotations

import datetime as dt

import pytest
from support import T0, new_job

from conveyor import Conveyor
from conveyor.backends.base import Backend
from conveyor.cron import Scheduler, run_now
from conveyor.errors import UnknownSchedule


def ts(*args: int) -> float:
    return dt.datetime(*args, tzinfo=dt.UTC).timestamp()  # type: ignore[misc]


def _jobs_of(app: Conveyor, task: str) -> list:  # type: ignore[type-arg]
    return app.backend.list_jobs(task=task, limit=1000).jobs


# -- the store's contract --------------------------------------------------------------------------

@pytest.mark.needs("cron")
def test_a_disabled_schedule_takes_its_ticks_but_writes_no_job(backend: Backend) -> None:
    assert backend.cron_enqueue("nightly", T0, None, now=T0) is None
    assert backend.set_cron_enabled("nightly", False, now=T0 + 1) is True
    assert backend.set_cron_enabled("nightly", False, now=T0 + 2) is False  # already disabled
    # A scheduler that read "enabled" before the disable still cannot enqueue: the check is
    # inside the tick's compare-and-set.
    assert backend.cron_enqueue("nightly", T0 + 60, new_job(queue="cron"), now=T0 + 60) is None
    assert backend.list_jobs(queue="cron", limit=10).jobs == []
    assert backend.cron_ticks() == {"nightly": T0 + 60}  # taken, so enabling fires no burst
    state = backend.cron_states()["nightly"]
    assert (state.name, state.last_tick, state.disabled_at, state.last_job_id) == (
        "nightly", T0 + 60, T0 + 1, None)
    assert state.disabled


@pytest.mark.needs("cron")
def test_enabling_skips_ticks_from_before_it(backend: Backend) -> None:
    backend.cron_enqueue("n", T0, None, now=T0)
    backend.set_cron_enabled("n", False, now=T0 + 10)
    assert backend.set_cron_enabled("n", True, now=T0 + 130) is True
    assert backend.set_cron_enabled("n", True, now=T0 + 131) is False  # already enabled
    state = backend.cron_states()["n"]
    assert state.disabled_at is None and state.enabled_at == T0 + 130 and not state.disabled
    # No scheduler came by while it was disabled: the tick at T0+120 fell in that time and is
    # taken without a job; the first tick after enabling runs.
    assert backend.cron_enqueue("n", T0 + 120, new_job(queue="cron"), now=T0 + 135) is None
    assert backend.list_jobs(queue="cron", limit=10).jobs == []
    made = backend.cron_enqueue("n", T0 + 180, new_job(queue="cron"), now=T0 + 180)
    assert made is not None and made.created
    assert backend.cron_states()["n"].last_job_id == made.id


@pytest.mark.needs("cron")
def test_disabling_a_schedule_no_scheduler_has_seen_starts_it_disabled(backend: Backend) -> None:
    assert backend.set_cron_enabled("fresh", False, now=T0) is True
    state = backend.cron_states()["fresh"]
    assert state.disabled_at == T0 and state.last_job_id is None
    # Nothing at or before the moment it was disabled is due (as a first sight records).
    assert state.last_tick == T0
    assert backend.cron_enqueue("fresh", T0 - 60, new_job(queue="cron"), now=T0) is None
    assert backend.cron_enqueue("fresh", T0 + 60, new_job(queue="cron"), now=T0 + 60) is None
    assert backend.list_jobs(queue="cron", limit=10).jobs == []
    # Enabling a schedule never disabled changes nothing.
    assert backend.set_cron_enabled("other", True, now=T0) is False
    assert "other" not in backend.cron_states()


@pytest.mark.needs("cron")
def test_last_job_id_is_the_job_of_the_latest_tick(backend: Backend) -> None:
    backend.cron_enqueue("s", T0, None, now=T0)
    assert backend.cron_states()["s"].last_job_id is None  # a first sight runs nothing
    first = backend.cron_enqueue("s", T0 + 60, new_job(queue="cron"), now=T0 + 60)
    assert first is not None
    assert backend.cron_states()["s"].last_job_id == first.id
    # A scheduler that lost the race for the tick changes nothing.
    assert backend.cron_enqueue("s", T0 + 60, new_job(queue="cron"), now=T0 + 61) is None
    assert backend.cron_states()["s"].last_job_id == first.id
    second = backend.cron_enqueue("s", T0 + 120, new_job(queue="cron"), now=T0 + 120)
    assert second is not None and second.id != first.id
    states = backend.cron_states()
    assert states["s"].last_job_id == second.id and states["s"].last_tick == T0 + 120
    assert backend.get(second.id) is not None


# -- through the scheduler and the app ---------------------------------------------------------------

@pytest.mark.needs("cron")
def test_a_disabled_schedule_enqueues_nothing_from_any_scheduler(app: Conveyor) -> None:
    @app.cron("* * * * *", name="beat")
    def beat() -> None: ...

    schedulers = [Scheduler(app) for _ in range(3)]
    for s in schedulers:  # they all see it enabled and run its next tick
        s.run_pending(now=ts(2026, 1, 1, 12, 0, 30))
    made = [m for s in schedulers for m in s.run_pending(now=ts(2026, 1, 1, 12, 1, 5))]
    assert len(made) == 1
    assert app.backend.set_cron_enabled("beat", False, now=ts(2026, 1, 1, 12, 1, 30))
    for minute in range(2, 8):
        for s in schedulers:
            assert s.run_pending(now=ts(2026, 1, 1, 12, minute, 1)) == []
    assert [j.id for j in _jobs_of(app, beat.name)] == [made[0].id]
    state = app.backend.cron_states()["beat"]
    assert state.last_tick == ts(2026, 1, 1, 12, 7)  # taken while disabled
    assert state.last_job_id == made[0].id  # the last run stays the last one that ran


@pytest.mark.needs("cron")
def test_enabling_resumes_from_the_next_tick_without_a_burst(app: Conveyor) -> None:
    @app.cron("* * * * *", name="beat")
    def beat() -> None: ...

    scheduler = Scheduler(app)
    scheduler.run_pending(now=ts(2026, 1, 1, 12, 0, 30))
    app.backend.set_cron_enabled("beat", False, now=ts(2026, 1, 1, 12, 0, 40))
    scheduler.run_pending(now=ts(2026, 1, 1, 12, 3, 1))  # one scheduler came by while disabled
    # Then none for a while; enabled at 12:10:30, between ticks.
    app.backend.set_cron_enabled("beat", True, now=ts(2026, 1, 1, 12, 10, 30))
    late = Scheduler(app)  # a scheduler that never saw it disabled
    assert late.run_pending(now=ts(2026, 1, 1, 12, 10, 45)) == []  # 12:10 was before enabling
    assert scheduler.run_pending(now=ts(2026, 1, 1, 12, 10, 50)) == []
    assert _jobs_of(app, beat.name) == []
    made = late.run_pending(now=ts(2026, 1, 1, 12, 11, 1)) + \
        scheduler.run_pending(now=ts(2026, 1, 1, 12, 11, 2))
    assert len(made) == 1  # one job: the first tick after enabling, not the missed ones
    [job] = _jobs_of(app, beat.name)
    assert job.meta["cron"]["tick"] == ts(2026, 1, 1, 12, 11)
    assert app.backend.cron_states()["beat"].last_job_id == job.id


@pytest.mark.needs("cron")
def test_run_now_enqueues_once_and_does_not_move_the_schedule(app: Conveyor) -> None:
    @app.cron("0 9 * * *", name="report", kwargs={"day": "today"})
    def report(day: str) -> None: ...

    Scheduler(app).run_pending(now=ts(2026, 1, 1, 12, 0))
    before = app.backend.cron_states()["report"]
    made = run_now(app, "report")
    assert made.created
    job = app.get_job(made.id)
    assert job.task == report.name and job.queue == report.queue
    assert job.args == {"day": "today"}
    assert job.meta["cron"]["schedule"] == "report" and job.meta["cron"]["manual"] is True
    assert [j.id for j in _jobs_of(app, report.name)] == [made.id]
    after = app.backend.cron_states()["report"]
    assert (after.last_tick, after.last_job_id) == (before.last_tick, before.last_job_id)
    # Twice is two runs: each is a manual run of its own, never merged by a unique key.
    again = run_now(app, "report")
    assert again.created and again.id != made.id
    # A disabled schedule can still be run by hand; its ticks still make nothing.
    app.backend.set_cron_enabled("report", False)
    assert run_now(app, "report").created
    with pytest.raises(UnknownSchedule):
        run_now(app, "no-such-schedule")
