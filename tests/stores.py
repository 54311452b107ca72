"""The stores the tests run against: one fresh, empty store per test (or per example),
for every backend. Importable as ``stores`` (tests/ is on sys.path); conftest.py builds the
``store_url``/``backend``/``app`` fixtures on it.

Adding a backend is two steps: write a ``<name>_store(tmp_path)`` context manager that yields
a URL for a fresh, empty store (raising :class:`BackendUnavailable` if its service cannot be
reached) and add one ``BackendSpec`` line to ``BACKENDS``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest


class BackendUnavailable(Exception):
    """The backend's service cannot be reached from this machine."""


StoreFactory = Callable[[Path], contextlib.AbstractContextManager[str]]


@dataclass(frozen=True)
class BackendSpec:
    name: str
    store: StoreFactory  # yields the URL of a fresh, empty store; cleans it up afterwards


@contextlib.contextmanager
def sqlite_store(tmp_path: Path) -> Iterator[str]:
    yield f"sqlite:///{tmp_path}/c.db"


POSTGRES_URL = os.environ.get("CONVEYOR_TEST_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/test")


@contextlib.contextmanager
def postgres_store(tmp_path: Path) -> Iterator[str]:
    """A fresh schema per test in the machine's PostgreSQL, dropped afterwards."""
    import uuid

    import psycopg

    schema = f"conveyor_test_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        raise BackendUnavailable(f"cannot connect to {POSTGRES_URL}: {exc}") from exc
    with admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        sep = "&" if "?" in POSTGRES_URL else "?"
        try:
            yield f"{POSTGRES_URL}{sep}options=-csearch_path%3D{schema}"
        finally:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


REDIS_URL = os.environ.get("CONVEYOR_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@contextlib.contextmanager
def redis_store(tmp_path: Path) -> Iterator[str]:
    """A fresh key prefix per test in the machine's Redis; its keys are deleted afterwards."""
    import uuid

    import redis

    prefix = f"conveyor_test_{uuid.uuid4().hex[:12]}"
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=1, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.RedisError as exc:
        client.close()
        raise BackendUnavailable(f"cannot connect to {REDIS_URL}: {exc}") from exc
    sep = "&" if "?" in REDIS_URL else "?"
    try:
        yield f"{REDIS_URL}{sep}prefix={prefix}"
    finally:
        # Only this test's keys; the server is shared. The pattern has no glob characters but *.
        keys = list(client.scan_iter(match=f"{{{prefix}}}*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start:start + 500])
        client.close()


BACKENDS: list[BackendSpec] = [
    BackendSpec("sqlite", sqlite_store),
    BackendSpec("postgres", postgres_store),
    BackendSpec("redis", redis_store),
]


NOT_YET_IMPLEMENTED: list[str] = []
_skipped: dict[str, str] = {}


def _unavailable(name: str, exc: BackendUnavailable) -> NoReturn:
    reason = f"{name} backend unavailable: {exc}"
    _skipped[name] = str(exc)
    if os.environ.get("CI") == "true":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


