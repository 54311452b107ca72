"""The Conveyor app shared by the benchmark's producer and its worker process: no-op tasks."""

from __future__ import annotations

from typing import Any

from conveyor import Conveyor

NOOP = "bench.noop"


def make_app(url: str) -> tuple[Conveyor, Any]:
    """An app on ``url`` with one task, ``bench.noop(i)``, that does nothing."""
    app = Conveyor(url)

    @app.task(name=NOOP)
    def noop(i: int = 0) -> None:
        return None

    return app, noop
