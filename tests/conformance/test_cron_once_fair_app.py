"""Cron, exactly-once steps, fair sharing and unique jobs through the public API and a real
worker, on every backend."""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

import pytest
from support import running_worker, wait_for_job, wait_until

from conveyor import Conveyor, current_job
from conveyor.cron import Schedule, Scheduler
from conveyor.errors import ConfigurationError
from conveyor.job import JobState

UTC = dt.UTC


def ts(*args: int, tz: dt.tzinfo = UTC) -> float:
    return dt.datetime(*args, tzinfo=tz).timestamp()  # type: ignore[misc]


def _jobs_of(app: Conveyor, task: str) -> list[Any]:
    return app.backend.list_jobs(task=task, limit=1000).jobs


# -- cron -----------------------------------------------------------------------------------------

@pytest.mark.needs("cron")
def test_each_tick_runs_once_however_many_schedulers(app: Conveyor) -> None:
    @app.cron("*/5 * * * *", name="five")
    def report() -> None: ...

    schedulers = [Scheduler(app) for _ in range(4)]
    start = ts(2026, 1, 1, 12, 2)
    for s in schedulers:  # first sight: the 12:00 tick is recorded, not run
        assert s.run_pending(now=start) == []
    assert app.backend.cron_ticks() == {"five": ts(2026, 1, 1, 12, 0)}

    made = []
    for minute in range(3, 21):  # 12:03 .. 12:20, every scheduler every minute
        for s in schedulers:
            made += s.run_pending(now=ts(2026, 1, 1, 12, minute))
    jobs = sorted(_jobs_of(app, report.name), key=lambda j: j.meta["cron"]["tick"])
    assert len(made) == len(jobs) == 4  # 12:05, 12:10, 12:15, 12:20
    assert [j.meta["cron"]["tick"] for j in jobs] == [ts(2026, 1, 1, 12, m) for m in (5, 10, 15, 20)]
    assert all(j.meta["cron"]["schedule"] == "five" for j in jobs)


@pytest.mark.needs("cron")
def test_racing_schedulers_in_threads_make_one_job_per_tick(app: Conveyor) -> None:
    @app.cron("* * * * *", name="every-minute")
    def beat() -> None: ...

    Scheduler(app).run_pending(now=ts(2026, 1, 1, 0, 0, 30))
    barrier = threading.Barrier(6)

    def run() -> None:
        s = Scheduler(app)
        barrier.wait()
        for minute in range(1, 6):
            s.run_pending(now=ts(2026, 1, 1, 0, minute, 1))

    threads = [threading.Thread(target=run) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    ticks = sorted(j.meta["cron"]["tick"] for j in _jobs_of(app, beat.name))
    assert ticks == [ts(2026, 1, 1, 0, m) for m in range(1, 6)]


@pytest.mark.needs("cron")
def test_after_an_outage_only_the_latest_missed_tick_runs(app: Conveyor) -> None:
    @app.cron("0 * * * *", name="hourly")
    def hourly() -> None: ...

    s = Scheduler(app)
    s.run_pending(now=ts(2026, 1, 1, 0, 30))
    # Down from 00:30 to 05:10: ticks 01:00 .. 05:00 were missed.
    made = Scheduler(app).run_pending(now=ts(2026, 1, 1, 5, 10))
    assert len(made) == 1
    [job] = _jobs_of(app, hourly.name)
    assert job.meta["cron"]["tick"] == ts(2026, 1, 1, 5, 0)


def test_daylight_saving_fall_back_fires_a_wall_clock_time_once() -> None:
    ny = "America/New_York"
    daily = Schedule(name="d", expression="30 1 * * *", task="t", queue="q", timezone=ny)
    # 2026-11-01: 01:30 EDT (05:30 UTC), then clocks go back and 01:30 EST (06:30 UTC) repeats.
    first = ts(2026, 11, 1, 5, 30)
    assert daily.latest_tick(ts(2026, 11, 1, 6, 45)) == first
    assert daily.next_tick(first) == ts(2026, 11, 2, 6, 30)
    # Hour field '*': every real 20 minutes, through the repeated hour too.
    every = Schedule(name="e", expression="*/20 * * * *", task="t", queue="q", timezone=ny)
    assert every.next_tick(ts(2026, 11, 1, 5, 40)) == ts(2026, 11, 1, 6, 0)


def test_daylight_saving_spring_forward_fires_a_skipped_time_once() -> None:
    daily = Schedule(name="d", expression="30 2 * * *", task="t", queue="q", timezone="America/New_York")
    # 2026-03-08: 02:00 EST jumps to 03:00 EDT; 02:30 does not exist that day.
    ticks = [daily.next_tick(ts(2026, 3, 7, 12, 0))]
    ticks.append(daily.next_tick(ticks[-1]))
    assert ticks == [ts(2026, 3, 8, 7, 0), ts(2026, 3, 9, 6, 30)]


def test_the_scheduler_honours_a_timezone(app: Conveyor) -> None:
    @app.cron("0 9 * * *", name="paris-morning", timezone="Europe/Paris")
    def morning() -> None: ...

    sched = app.schedules["paris-morning"]
    nxt = sched.next_run(dt.datetime(2026, 7, 1, 0, 0, tzinfo=UTC))
    assert nxt.isoformat() == "2026-07-01T09:00:00+02:00"


@pytest.mark.needs("cron")
def test_cron_jobs_run_in_a_worker_and_know_their_tick(app: Conveyor) -> None:
    seen: list[dt.datetime | None] = []

    @app.cron("* * * * *", name="minutely", kwargs={"label": "x"})
    def minutely(label: str) -> str:
        ctx = current_job()
        assert ctx is not None
        seen.append(ctx.cron_tick)
        return label

    now = app.backend.now()
    last_minute = (now // 60) * 60
    app.backend.cron_enqueue("minutely", last_minute - 60, None)  # as if seen a minute ago
    with running_worker(app, concurrency=2):
        [job] = wait_until(lambda: [j for j in _jobs_of(app, minutely.name) if j.is_final], timeout=10)
    assert job.state is JobState.SUCCEEDED and job.result == "x"
    tick = job.meta["cron"]["tick"]
    assert tick in (last_minute, last_minute + 60)  # the minute may turn while the worker starts
    assert seen == [dt.datetime.fromtimestamp(tick, UTC)] and job.run_at == tick


@pytest.mark.needs("cron")
def test_no_scheduler_means_no_cron_jobs(app: Conveyor) -> None:
    @app.cron("* * * * *", name="minutely")
    def minutely() -> None: ...

    now = app.backend.now()
    app.backend.cron_enqueue("minutely", (now // 60) * 60 - 60, None)
    with running_worker(app, scheduler=False):
        time.sleep(1.0)
    assert _jobs_of(app, minutely.name) == []


def test_bad_schedules_are_refused_at_registration(app: Conveyor) -> None:
    @app.task(name="needs_arg")
    def needs_arg(x: int) -> None: ...

    with pytest.raises(ConfigurationError, match="cron expression"):
        app.schedule(needs_arg, "every tuesday", kwargs={"x": 1})
    with pytest.raises(ConfigurationError, match="timezone"):
        app.schedule(needs_arg, "* * * * *", timezone="Mars/Olympus", kwargs={"x": 1})
    with pytest.raises(Exception, match="x"):
        app.schedule(needs_arg, "* * * * *")  # missing argument: fail now, not at the tick
    app.schedule(needs_arg, "* * * * *", kwargs={"x": 1})
    with pytest.raises(ConfigurationError, match="already named"):
        app.schedule(needs_arg, "*/2 * * * *", kwargs={"x": 2})


# -- exactly-once steps ---------------------------------------------------------------------------

@pytest.mark.needs("lookup")
def test_a_redelivered_job_skips_the_steps_its_earlier_attempt_finished(app: Conveyor) -> None:
    effects: list[str] = []

    def charge(order: int) -> dict[str, Any]:
        effects.append(f"charge {order}")
        return {"charge_id": f"ch_{order}"}

    @app.task(name="checkout", max_attempts=3)
    def checkout(order: int) -> str:
        ctx = current_job()
        assert ctx is not None
        receipt = ctx.once("charge-card", charge, order)
        effects.append(f"email {receipt['charge_id']} attempt {ctx.attempt}")
        if ctx.attempt == 1:
            raise RuntimeError("mail server down")  # after the charge: the retry must not charge again
        return str(receipt["charge_id"])

    job = checkout.enqueue(7)
    with running_worker(app):
        done = wait_for_job(app, job.id, timeout=20)
    assert done.state is JobState.SUCCEEDED and done.result == "ch_7"
    assert effects == ["charge 7", "email ch_7 attempt 1", "email ch_7 attempt 2"]
    assert done.steps == {"charge-card": {"charge_id": "ch_7"}}


@pytest.mark.needs("lookup")
def test_async_tasks_use_aonce(app: Conveyor) -> None:
    calls: list[int] = []

    async def send(n: int) -> int:
        calls.append(n)
        return n * 2

    @app.task(name="async_steps", max_attempts=2)
    async def async_steps(n: int) -> int:
        ctx = current_job()
        assert ctx is not None
        doubled = await ctx.aonce("send", send, n)
        if ctx.attempt == 1:
            raise RuntimeError("later failure")
        return int(doubled)

    job = async_steps.enqueue(21)
    with running_worker(app):
        done = wait_for_job(app, job.id, timeout=20)
    assert done.state is JobState.SUCCEEDED and done.result == 42
    assert calls == [21]


# -- fair sharing through a worker ----------------------------------------------------------------

@pytest.mark.needs("fair")
def test_a_small_tenant_finishes_within_about_a_hundred_completions(app: Conveyor) -> None:
    finished: list[str] = []
    lock = threading.Lock()

    @app.task(name="tenant_work")
    def tenant_work(tenant: str) -> None:
        with lock:
            finished.append(tenant)

    tenant_work.options(fair_key="A").enqueue_many([("A",)] * 5000)
    with running_worker(app, concurrency=4):
        wait_until(lambda: len(finished) >= 20, timeout=30, message="tenant A flowing")
        with lock:
            before = len(finished)
        tenant_work.options(fair_key="B").enqueue_many([("B",)] * 50)
        wait_until(lambda: finished.count("B") == 50, timeout=60, message="all of B done")
        with lock:
            after = finished.index("B", before)
            last_b = max(i for i, t in enumerate(finished) if t == "B")
    # Completions after B's enqueue until B's last one: B's 50 plus about as many of A's.
    assert last_b - before < 120, (before, after, last_b)


# -- unique jobs ---------------------------------------------------------------------------------

@pytest.mark.needs("unique")
def test_fifty_concurrent_enqueues_of_one_key_make_one_job(app: Conveyor) -> None:
    @app.task(name="dedup")
    def dedup(n: int) -> None: ...

    barrier = threading.Barrier(50)
    ids: list[int] = []
    lock = threading.Lock()

    def go(i: int) -> None:
        barrier.wait()
        job = dedup.options(unique_key="one-only").enqueue(i)
        with lock:
            ids.append(job.id)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(ids) == 50 and len(set(ids)) == 1
    assert len(_jobs_of(app, dedup.name)) == 1


@pytest.mark.needs("unique")
def test_unique_for_keeps_the_key_after_success(app: Conveyor) -> None:
    @app.task(name="daily_digest")
    def daily_digest(user: int) -> None: ...

    first = daily_digest.options(unique_key="digest:1", unique_for=dt.timedelta(hours=1)).enqueue(1)
    with running_worker(app):
        wait_for_job(app, first.id, "succeeded")
    again = daily_digest.options(unique_key="digest:1", unique_for=3600).enqueue(1)
    assert again.id == first.id and again.state is JobState.SUCCEEDED
    other = daily_digest.options(unique_key="digest:1").enqueue(1)  # the window is the old job's
    assert other.id == first.id
    with pytest.raises(ConfigurationError, match="unique_key"):
        daily_digest.options(unique_for=10).enqueue(1)
