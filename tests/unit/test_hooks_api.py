"""The hook registry's own rules (no store needed)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import conveyor
from conveyor import ConfigurationError, Conveyor, HookEvent


def test_hook_event_is_exported_and_frozen(tmp_path: Path) -> None:
    assert "HookEvent" in conveyor.__all__
    app = Conveyor(f"sqlite:///{tmp_path}/x.db")
    event = HookEvent(name="worker_started", app=app, worker_id="w1")
    assert event.job is None and event.result is None and event.error is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.name = "x"  # type: ignore[misc]


def test_unknown_event_names_are_refused(tmp_path: Path) -> None:
    app = Conveyor(f"sqlite:///{tmp_path}/x.db")
    with pytest.raises(ConfigurationError, match=r"job_finished.*job_started"):
        @app.on("job_finished")
        def hook(event: HookEvent) -> None: ...


def test_on_returns_the_function_and_accepts_async(tmp_path: Path) -> None:
    app = Conveyor(f"sqlite:///{tmp_path}/x.db")

    def f(event: HookEvent) -> None: ...

    async def g(event: HookEvent) -> None: ...

    assert app.on("job_started")(f) is f
    assert app.on("job_dead")(g) is g
