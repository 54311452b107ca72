"""PostgreSQL: a step recorded with ``once()`` inside ``transaction()`` commits or rolls back
together with the task's own writes and its job's success."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from pgrig import fresh_schema
from support import running_worker, wait_for_job

from conveyor import Conveyor, JobState, current_job


@pytest.fixture
def pg_url() -> Iterator[str]:
    with fresh_schema() as url:
        yield url


@pytest.fixture
def app(pg_url: str) -> Iterator[Conveyor]:
    a = Conveyor(pg_url, visibility_timeout=5)
    yield a
    a.close()


def test_a_step_inside_a_failed_transaction_is_not_recorded(app: Conveyor, pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("CREATE TABLE ledger (job bigint, attempt int, entry text)")
    charges: list[int] = []

    def charge(attempt: int) -> str:
        charges.append(attempt)
        return f"ch_{attempt}"

    @app.task(name="pay", max_attempts=3)
    def pay() -> str:
        ctx = current_job()
        assert ctx is not None
        with ctx.transaction(result="paid") as conn:
            receipt = ctx.once("charge", charge, ctx.attempt)
            conn.execute("INSERT INTO ledger VALUES (%s, %s, %s)", (ctx.id, ctx.attempt, receipt))
            if ctx.attempt == 1:
                raise RuntimeError("crash before commit: the ledger row and the step vanish together")
        return "unreachable"

    job = pay.enqueue()
    with running_worker(app):
        done = wait_for_job(app, job.id, timeout=20)
    assert done.state is JobState.SUCCEEDED and done.result == "paid" and done.attempts == 2
    # The first attempt's step rolled back with its ledger row, so the second ran it again,
    # and exactly one of each is stored.
    assert charges == [1, 2]
    assert done.steps == {"charge": "ch_2"}
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute("SELECT attempt, entry FROM ledger").fetchall()
    assert rows == [(2, "ch_2")]


def test_a_step_recorded_before_a_later_failure_is_kept(app: Conveyor) -> None:
    calls: list[int] = []

    @app.task(name="two_phase", max_attempts=3)
    def two_phase() -> int:
        ctx = current_job()
        assert ctx is not None
        value = ctx.once("reserve", lambda: calls.append(ctx.attempt) or 41)
        if ctx.attempt == 1:
            raise RuntimeError("after the step: the retry must skip it")
        return int(value) + 1

    job = two_phase.enqueue()
    with running_worker(app):
        done = wait_for_job(app, job.id, timeout=20)
    assert done.state is JobState.SUCCEEDED and done.result == 42
    assert calls == [1]
