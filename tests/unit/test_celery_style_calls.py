"""Celery's call styles on a Conveyor task say what to write instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor import Conveyor
from conveyor.errors import ArgumentsError


@pytest.fixture
def app(tmp_path: Path) -> Conveyor:
    return Conveyor(f"sqlite:///{tmp_path}/c.db")


def test_delay_points_to_enqueue(app: Conveyor) -> None:
    @app.task
    def add(a: int, b: int) -> int:
        return a + b

    with pytest.raises(TypeError, match=r"add\.enqueue\(\*args, \*\*kwargs\)"):
        add.delay(1, 2)
    with pytest.raises(TypeError, match=r"\.enqueue\(\*args"):
        add.options(priority=1).delay(1, 2)


def test_apply_async_points_to_options_and_enqueue(app: Conveyor) -> None:
    @app.task
    def add(a: int, b: int) -> int:
        return a + b

    with pytest.raises(TypeError, match=r"add\.options\(delay=10\)\.enqueue\(1, 2\)"):
        add.apply_async((1, 2), countdown=10)
    with pytest.raises(TypeError, match=r"add\.options\(queue='low', priority=3\)\.enqueue\(1, b=2\)"):
        add.apply_async((1,), {"b": 2}, queue="low", priority=3)
    with pytest.raises(TypeError, match=r"options\(run_at=\.\.\.\)"):
        add.apply_async((1, 2), eta=0)


@pytest.mark.parametrize("word", ["countdown", "eta"])
def test_a_celery_option_passed_to_enqueue_points_to_options(app: Conveyor, word: str) -> None:
    @app.task
    def add(a: int, b: int) -> int:
        return a + b

    with pytest.raises(ArgumentsError, match=r"options\((delay|run_at)=\.\.\.\)\.enqueue"):
        add.enqueue(1, 2, **{word: 10})
    assert app.backend.stats().queues == []  # nothing written


def test_a_task_with_a_parameter_of_that_name_takes_it(app: Conveyor) -> None:
    @app.task
    def tick(countdown: int) -> int:
        return countdown

    assert tick.enqueue(countdown=3).args == {"countdown": 3}
