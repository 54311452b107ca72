"""Run the programs under ``examples/`` against real stores: a private schema of the machine's
PostgreSQL, or an SQLite file in the test's tmp dir.

Each example reads its store from the environment when its modules are imported, as a
deployed app would; ``load_example`` sets the environment, imports the example afresh, and
closes its Conveyor apps and forgets its modules afterwards.
"""

from __future__ import annotations

import importlib
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

from conveyor import Conveyor

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
POSTGRES_URL = os.environ.get("CONVEYOR_TEST_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/test")

if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))


def _unavailable(reason: str) -> NoReturn:
    """Skip locally; fail in CI, so a missing PostgreSQL can never turn the run green."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"PostgreSQL unavailable: {reason}", pytrace=False)
    pytest.skip(f"PostgreSQL unavailable: {reason}")


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A URL whose search_path is a fresh, empty schema (dropped afterwards)."""
    import psycopg

    schema = f"conveyor_example_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        _unavailable(f"cannot connect to {POSTGRES_URL}: {exc}")
    with admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        sep = "&" if "?" in POSTGRES_URL else "?"
        try:
            yield f"{POSTGRES_URL}{sep}options=-csearch_path%3D{schema}"
        finally:
            # Other sessions of this schema (pools) may still be closing: drop regardless.
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


def _forget(package: str) -> None:
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[name]


@pytest.fixture
def load_example(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., ModuleType]]:
    """``load_example("fastapi_orders.web", DATABASE_URL=url)``: import an example module
    with that environment, freshly (so each test gets apps bound to its own store)."""
    loaded: list[str] = []

    def load(module: str, **env: str) -> ModuleType:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        package = module.partition(".")[0]
        _forget(package)
        loaded.append(package)
        return importlib.import_module(module)

    try:
        yield load
    finally:
        for package in loaded:
            for name, mod in list(sys.modules.items()):
                if name == package or name.startswith(package + "."):
                    for value in vars(mod).values():
                        if isinstance(value, Conveyor):
                            value.close()
            _forget(package)
