"""Retry filters on each backend: ``@app.task(retry_on=..., dead_on=...)`` decide whether a
failed attempt is retried or goes dead at once, and the stored error says which and why.

A real Worker on a background thread; conditions are awaited by polling the store."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from support import running_worker, wait_for_job

from conveyor import Conveyor, JobState, Retry, RetryPolicy
from conveyor.executor import current_job


@pytest.fixture
def app(make_app: Callable[..., Conveyor]) -> Conveyor:
    """Quick retries (a few ms) so a retried job comes back at once."""
    return make_app(retry=RetryPolicy(base=0.01, cap=0.05))


class PaymentDeclined(ValueError):
    pass


def attempt() -> int:
    ctx = current_job()
    assert ctx is not None
    return ctx.attempt


@pytest.mark.needs("lookup")
def test_retry_on_retries_only_the_listed_exceptions_and_their_subclasses(
        app: Conveyor) -> None:
    @app.task(name="fetch", max_attempts=5, retry_on=(OSError, TimeoutError))
    def fetch(fail_with: str) -> int:
        n = attempt()
        if n == 1:
            raise {"refused": ConnectionRefusedError("upstream refused"),
                   "timeout": TimeoutError("upstream slow")}[fail_with]
        return n

    @app.task(name="parse", max_attempts=5, retry_on=(ConnectionError, TimeoutError))
    async def parse() -> None:
        await asyncio.sleep(0)
        raise KeyError("price")

    with running_worker(app):
        refused, slow, bad = fetch.enqueue("refused"), fetch.enqueue("timeout"), parse.enqueue()
        done = [wait_for_job(app, j.id) for j in (refused, slow, bad)]

    for job in done[:2]:  # listed (a subclass of OSError; TimeoutError itself): retried
        assert (job.state, job.attempts, job.result) == (JobState.SUCCEEDED, 2, 2)
        assert [e["kind"] for e in job.errors] == ["exception"]
    dead = done[2]  # not listed: dead on its first attempt, with 4 attempts left
    assert (dead.state, dead.attempts) == (JobState.DEAD, 1)
    [e] = dead.errors
    assert (e["kind"], e["type"]) == ("not_in_retry_on", "KeyError")
    assert e["message"].startswith("'price'")
    assert "not retried: KeyError is not in retry_on (ConnectionError, TimeoutError)" in (
        e["message"])
    assert "Traceback" in e["traceback"]


@pytest.mark.needs("lookup")
def test_dead_on_goes_dead_at_once_even_when_retry_on_lists_it(app: Conveyor) -> None:
    @app.task(name="charge", max_attempts=5, dead_on=(ValueError,))
    def charge(card: str) -> None:
        raise PaymentDeclined(f"card {card} declined")

    @app.task(name="charge_listed", max_attempts=5, retry_on=(Exception,),
              dead_on=(PaymentDeclined,))
    def charge_listed() -> None:
        if attempt() == 1:
            raise RuntimeError("gateway hiccup")  # retried: in retry_on, not in dead_on
        raise PaymentDeclined("declined on retry")

    with running_worker(app):
        a = wait_for_job(app, charge.enqueue("4242").id)
        b = wait_for_job(app, charge_listed.enqueue().id)

    assert (a.state, a.attempts) == (JobState.DEAD, 1)
    [e] = a.errors
    assert e["kind"] == "dead_on"
    assert e["type"].endswith("PaymentDeclined")
    assert e["message"] == ("card 4242 declined [not retried: PaymentDeclined is in dead_on "
                            "(ValueError)]")
    assert (b.state, b.attempts) == (JobState.DEAD, 2)
    assert [x["kind"] for x in b.errors] == ["exception", "dead_on"]


@pytest.mark.needs("lookup")
def test_an_explicit_retry_is_retried_whatever_the_filters(app: Conveyor) -> None:
    @app.task(name="poll", max_attempts=5, retry_on=(ConnectionError,), dead_on=(Exception,))
    def poll() -> int:
        n = attempt()
        if n < 3:
            raise Retry(delay=0, reason="not ready")
        return n

    with running_worker(app):
        job = wait_for_job(app, poll.enqueue().id)

    assert (job.state, job.attempts, job.result) == (JobState.SUCCEEDED, 3, 3)
    assert [e["kind"] for e in job.errors] == ["retry", "retry"]


@pytest.mark.needs("lookup")
def test_a_timeout_counts_as_a_timeout_error(app: Conveyor) -> None:
    seen: list[Any] = []

    @app.task(name="hangs", max_attempts=3, timeout=0.2, retry_on=(ConnectionError,))
    async def hangs() -> None:
        seen.append(attempt())
        await asyncio.sleep(30)

    @app.task(name="hangs_listed", max_attempts=2, timeout=0.2, retry_on=(TimeoutError,))
    async def hangs_listed() -> None:
        await asyncio.sleep(30)

    with running_worker(app):
        dead = wait_for_job(app, hangs.enqueue().id)
        retried = wait_for_job(app, hangs_listed.enqueue().id)

    assert (dead.state, dead.attempts, seen) == (JobState.DEAD, 1, [1])
    [e] = dead.errors
    assert (e["kind"], e["type"]) == ("not_in_retry_on", "TimeoutError")
    assert "did not finish within its timeout" in e["message"]
    assert "not retried: TimeoutError is not in retry_on (ConnectionError)" in e["message"]
    assert (retried.state, retried.attempts) == (JobState.DEAD, 2)
    assert [x["kind"] for x in retried.errors] == ["timeout", "timeout"]
