"""Shared fixtures: one store per test, parametrized over every backend.

Adding a backend is two steps: write a ``<name>_store(tmp_path)`` context manager that yields
a URL for a fresh, empty store (raising :class:`BackendUnavailable` if its service cannot be
reached) and add one ``BackendSpec`` line to ``BACKENDS``. Every test that takes ``backend``,
``store_url``, ``app`` or ``make_app`` then runs against it too.

The conformance suite also runs on the message brokers (tests/conformance/conftest.py), which
lack some capabilities (``Backend.missing``). A test that needs one says so with
``@pytest.mark.needs("lookup", ...)``; on a store that lacks it, the test is deselected at
collection (not skipped) and counted per capability in the summary line, so a missing
capability never passes for a green test and a test that fails on a broker stays a failure.

A backend whose service is down is skipped locally and fails the run in CI (``CI=true``), so
a broken CI service can never turn the conformance suite green by skipping it.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
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

# Tests deselected because the store of their param lacks a capability they need, by capability.
_deselected_by_capability: Counter[str] = Counter()


def _missing_of(item: pytest.Item) -> frozenset[str]:
    """What the store of the item's parameters lacks (a param with ``missing``: the brokers)."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return frozenset()
    out: frozenset[str] = frozenset()
    for value in callspec.params.values():
        out |= getattr(value, "missing", frozenset())
    return out


@pytest.hookimpl(trylast=True)  # after -k and -m: count only what this run would have run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect a test whose ``needs`` names a capability its store lacks."""
    kept, dropped = [], []
    for item in items:
        needs = {name for mark in item.iter_markers("needs") for name in mark.args}
        lacking = needs & _missing_of(item)
        if lacking:
            dropped.append(item)
            _deselected_by_capability.update(lacking)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


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
    if _deselected_by_capability:
        line += "; deselected by capability: " + ", ".join(
            f"{name} {n}" for name, n in _deselected_by_capability.most_common())
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
def store_state() -> str | None:
    """The companion store's URL of a broker ``store_url`` (``state=``), else None."""
    return None


@pytest.fixture
def open_store(store_url: str, store_state: str | None) -> Iterator[Callable[[], Backend]]:
    """Open more Backends on the test's store (another worker's connection); closed at the end."""
    opened: list[Backend] = []

    def make() -> Backend:
        b = open_backend(store_url, state=store_state)
        opened.append(b)
        return b

    try:
        yield make
    finally:
        for b in opened:
            b.close()


@pytest.fixture
def backend(open_store: Callable[[], Backend]) -> Backend:
    """A Backend on the test's store. Tests through this fixture use only the Backend interface."""
    return open_store()


@pytest.fixture
def make_app(store_url: str, store_state: str | None) -> Iterator[Callable[..., Conveyor]]:
    """Build extra Conveyor apps on the test's store (e.g. with other settings); all closed at the end."""
    apps: list[Conveyor] = []

    def make(**kwargs: Any) -> Conveyor:
        kwargs.setdefault("state", store_state)
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
