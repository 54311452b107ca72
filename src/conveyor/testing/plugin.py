"""The pytest plugin, loaded through the ``pytest11`` entry point wherever Conveyor is
installed. Its fixtures:

``conveyor_url``
    The URL of a fresh, empty store for the test, deleted after it: a SQLite file in the
    test's ``tmp_path``; with ``CONVEYOR_TEST_URL`` (or the ini option ``conveyor_test_url``)
    naming a PostgreSQL or Redis server, a schema or key prefix of its own there.
``conveyor_app``
    The app named by the ini option ``conveyor_app`` (``package.module:app``, as
    ``conveyor worker --app`` takes it), pointed at ``conveyor_url`` for the test and back
    afterwards; without the option, a new ``Conveyor`` app on it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..app import Conveyor

URL_ENV = "CONVEYOR_TEST_URL"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("conveyor_app", "The Conveyor app the conveyor_app fixture gives, "
                  "as package.module:attribute", default="")
    parser.addini("conveyor_test_url", f"A PostgreSQL or Redis URL to make each test's "
                  f"store on (${URL_ENV} wins; default: SQLite in tmp_path)", default="")


def _load(spec: str) -> Conveyor:
    import importlib

    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise pytest.UsageError(f"conveyor_app = {spec}: cannot import {module_name}: "
                                f"{exc}") from None
    app = getattr(module, attr or "app", None)
    if not isinstance(app, Conveyor):
        raise pytest.UsageError(
            f"conveyor_app = {spec}: {module_name}.{attr or 'app'} is not a Conveyor app")
    return app


@pytest.fixture
def conveyor_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a fresh, empty store for this test, deleted afterwards."""
    from .stores import temporary_store

    base = os.environ.get(URL_ENV) or str(request.config.getini("conveyor_test_url")) or None
    with temporary_store(base, tmp_path) as url:
        yield url


@pytest.fixture
def conveyor_app(request: pytest.FixtureRequest, conveyor_url: str) -> Iterator[Conveyor]:
    """The app of the ``conveyor_app`` ini option on this test's store (or a new app)."""
    from .stores import using_store

    spec = str(request.config.getini("conveyor_app")).strip()
    if not spec:
        app = Conveyor(conveyor_url)
        try:
            yield app
        finally:
            app.close()
        return
    with using_store(_load(spec), conveyor_url) as app:
        yield app
