"""Shared fixtures: one store per test, parametrized over every backend.

Adding a backend is two steps: write a ``<name>_store(tmp_path)`` context manager that yields
a URL for a fresh, empty store (raising :class:`BackendUnavailable` if its service cannot be
reached) and add one ``BackendSpec`` line to ``BACKENDS``. Every test that takes ``backend``,
``store_url``, ``app`` or ``make_app`` then runs against it too.

A backend whose service is down is skipped locally and fails the run in CI (``CI=true``), so
a broken CI service can never turn the conformance suite green by skipping it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from stores import (
    BACKENDS,
    NOT_YET_IMPLEMENTED,
    BackendSpec,
    BackendUnavailable,
    _skipped,
    _unavailable,
    also_ran,
    close_postgres_template,
)

from conveyor import Conveyor
from conveyor.backends import open_backend
from conveyor.backends.base import Backend


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Drop the PostgreSQL template schema of this session and its copies (stores.py)."""
    close_postgres_template()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say plainly which backends ran, so a skip can never pass for a green run."""
    ran = [spec.name for spec in BACKENDS if spec.name not in _skipped]
    ran += sorted(also_ran - set(_skipped))
    line = f"conveyor backends tested: {', '.join(ran) or 'none'}"
    if _skipped:
        line += "; SKIPPED: " + "; ".join(f"{k} ({v})" for k, v in _skipped.items())
    if NOT_YET_IMPLEMENTED:
        line += f"; not implemented yet: {', '.join(NOT_YET_IMPLEMENTED)}"
    terminalreporter.write_sep("-", line)


@pytest.fixture(params=BACKENDS, ids=[spec.name for spec in BACKENDS])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a fresh store of each backend in turn."""
    spec: BackendSpec = request.param
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(spec.store(tmp_path))
        except BackendUnavailable as exc:
            _unavailable(spec.name, exc)
        yield url


@pytest.fixture
def backend(store_url: str) -> Iterator[Backend]:
    """A Backend on the test's store. Tests through this fixture use only the Backend interface."""
    b = open_backend(store_url)
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def make_app(store_url: str) -> Iterator[Callable[..., Conveyor]]:
    """Build extra Conveyor apps on the test's store (e.g. with other settings); all closed at the end."""
    apps: list[Conveyor] = []

    def make(**kwargs: Any) -> Conveyor:
        app = Conveyor(store_url, **kwargs)
        apps.append(app)
        return app

    try:
        yield make
    finally:
        for app in apps:
            app.close()


@pytest.fixture
def app(make_app: Callable[..., Conveyor]) -> Conveyor:
    """A Conveyor app on the same store as ``backend``."""
    return make_app()


@pytest.fixture(autouse=True)
def _pg_copy_from(monkeypatch: pytest.MonkeyPatch) -> None:
    """CONVEYOR_TEST_PG_COPY_MIN_JOBS=2 sends every PostgreSQL batch of plain jobs through the
    COPY path (tests/postgres/test_pg_copy_conformance.py runs the enqueue conformance tests so),
    which the suite's small batches would otherwise never reach."""
    value = os.environ.get("CONVEYOR_TEST_PG_COPY_MIN_JOBS")
    if value:
        from conveyor.backends.postgres import enqueue as pg_enqueue

        monkeypatch.setattr(pg_enqueue, "COPY_MIN_JOBS", int(value))
