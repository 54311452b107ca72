"""Results, step records and errors have bounded sizes on every backend: a result over
``max_result_bytes`` kills its job with a clear error instead of being written, and long error
messages and tracebacks are clipped with a note of how much was cut."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support import running_worker, wait_for_job

from conveyor import ConfigurationError, Conveyor, JobState, PayloadTooLarge, ResultTooLarge
from conveyor.executor import MAX_MESSAGE_CHARS, MAX_TRACEBACK_CHARS, current_job
from conveyor.payload import DEFAULT_MAX_RESULT_BYTES


def kinds(job: Any) -> list[str]:
    return [e["kind"] for e in job.errors]


@pytest.mark.needs("lookup")
def test_a_result_over_the_limit_kills_the_job_without_retries(make_app: Callable[..., Conveyor]) -> None:
    app = make_app(max_result_bytes=1000)

    @app.task(name="sized", max_attempts=5)
    def sized(n: int) -> str:
        return "é" * n  # 2 bytes each in UTF-8: the limit counts bytes

    with running_worker(app):
        fits = wait_for_job(app, sized.enqueue(499).id)  # "…" quotes: 998 + 2 bytes
        big = wait_for_job(app, sized.enqueue(500).id)

    assert fits.state is JobState.SUCCEEDED and fits.result == "é" * 499
    assert big.state is JobState.DEAD and big.attempts == 1 and big.result is None
    assert kinds(big) == ["result_too_large"]
    [err] = big.errors
    assert err["type"] == "conveyor.errors.ResultTooLarge"
    assert "1002 bytes" in err["message"] and "1000 bytes" in err["message"]
    assert "max_result_bytes" in err["message"]


@pytest.mark.needs("lookup")
def test_the_default_limit_is_one_mebibyte(app: Conveyor) -> None:
    assert app.max_result_bytes == DEFAULT_MAX_RESULT_BYTES == 1024 * 1024

    @app.task(name="huge")
    def huge() -> str:
        return "x" * (1024 * 1024)

    with running_worker(app):
        job = wait_for_job(app, huge.enqueue().id)
    assert job.state is JobState.DEAD and kinds(job) == ["result_too_large"] and job.result is None


@pytest.mark.needs("lookup")
def test_a_step_result_over_the_limit_is_not_recorded(make_app: Callable[..., Conveyor]) -> None:
    app = make_app(max_result_bytes=100)
    calls: list[int] = []

    @app.task(name="stepper", max_attempts=3)
    def stepper() -> str:
        ctx = current_job()
        assert ctx is not None
        small = ctx.once("small", lambda: "ok")
        calls.append(1)
        ctx.once("big", lambda: "x" * 200)
        return small

    with running_worker(app):
        job = wait_for_job(app, stepper.enqueue().id)
    assert job.state is JobState.DEAD and job.attempts == 1 and kinds(job) == ["result_too_large"]
    assert job.steps == {"small": "ok"} and calls == [1]
    assert "step 'big'" in job.errors[0]["message"]


@pytest.mark.needs("lookup")
def test_long_messages_and_tracebacks_are_clipped_visibly(app: Conveyor) -> None:
    def deep(n: int) -> None:
        if n == 0:
            raise ValueError("m" * 100_000 + " THE END")
        deep(n - 1)

    @app.task(name="loud", max_attempts=1)
    def loud() -> None:
        deep(400)

    with running_worker(app):
        job = wait_for_job(app, loud.enqueue().id)
    [err] = job.errors
    assert len(err["message"]) <= MAX_MESSAGE_CHARS and err["message"].startswith("mmm")
    assert "characters cut" in err["message"]
    tb = err["traceback"]
    assert len(tb) <= MAX_TRACEBACK_CHARS and "characters cut" in tb
    # Both ends kept: where it started, and the exception at the bottom.
    assert tb.startswith("Traceback (most recent call last)") and tb.rstrip().endswith("THE END")


def test_a_bad_limit_is_refused(make_app: Callable[..., Conveyor]) -> None:
    with pytest.raises(ConfigurationError, match="max_result_bytes"):
        make_app(max_result_bytes=0)
    assert issubclass(ResultTooLarge, PayloadTooLarge)  # one except clause catches both limits
