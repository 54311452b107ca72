"""Retry filters as declared: ``retry_on``/``dead_on`` are checked when the task is decorated
(exception classes only), so a typo fails at import, not on the first failure in production.
What a worker does with them is in tests/conformance/test_retry_filters.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor import Conveyor, Reject, Retry
from conveyor.errors import ConfigurationError


@pytest.fixture
def app(tmp_path: Path) -> Conveyor:
    return Conveyor(f"sqlite:///{tmp_path}/f.db")


def test_the_filters_are_kept_on_the_task(app: Conveyor) -> None:
    @app.task(retry_on=(ConnectionError, TimeoutError), dead_on=[ValueError])
    def fetch() -> None: ...

    @app.task(retry_on=OSError, dead_on=KeyError)  # one class for a tuple of one
    def one() -> None: ...

    @app.task
    def plain() -> None: ...

    assert (fetch.retry_on, fetch.dead_on) == ((ConnectionError, TimeoutError), (ValueError,))
    assert (one.retry_on, one.dead_on) == ((OSError,), (KeyError,))
    assert (plain.retry_on, plain.dead_on) == (None, ())


def test_cron_tasks_take_the_filters_too(app: Conveyor) -> None:
    @app.cron("0 3 * * *", name="nightly", retry_on=(ConnectionError,), dead_on=(ValueError,))
    def nightly() -> None: ...

    assert (nightly.retry_on, nightly.dead_on) == ((ConnectionError,), (ValueError,))


@pytest.mark.parametrize("bad", [
    "ValueError", ValueError("x"), (ValueError, "KeyError"), (int,), KeyboardInterrupt,
    (SystemExit,), Retry, (Reject,), 0, [[ValueError]],
])
@pytest.mark.parametrize("which", ["retry_on", "dead_on"])
def test_anything_but_exception_classes_is_refused_at_decoration(
        app: Conveyor, which: str, bad: object) -> None:
    with pytest.raises(ConfigurationError, match=which):
        @app.task(**{which: bad})  # type: ignore[call-overload]
        def task() -> None: ...
    assert app.tasks == {}, "a refused task was registered"


def test_an_empty_retry_on_retries_nothing_and_is_kept(app: Conveyor) -> None:
    @app.task(retry_on=())
    def never() -> None: ...

    assert never.retry_on == ()
