"""Fixtures of the fault tests: a fresh store per test on SQLite, on a *private* PostgreSQL and
on a *private* Redis (servers these tests start on their own ports and data directories,
never the machine's shared ones; see faultstore.py), and the harness's worker clusters.

The private servers live for the session (starting PostgreSQL costs seconds); each test gets a
fresh schema or key prefix on them. A test that stops or kills a server brings it back before
it ends, and the fixtures check it is up before handing it to the next test.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from faultstore import BACKEND_NAMES, FaultPostgres, FaultStore, open_fault_store
from harness import Cluster
from redisrig import RedisServer

TESTS = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    """Give ``import conftest`` back to the suite's root conftest (tests/conftest.py).

    Loading a conftest makes it ``sys.modules["conftest"]``, and test_lifecycle_model.py here
    does ``from conftest import BACKENDS``, which means the root one. This hook runs as soon as
    this file is registered, before the test modules beside it are imported. (Tests here that
    need this file's names import them from faultstore.)"""
    for plugin in config.pluginmanager.get_plugins():
        if getattr(plugin, "__file__", None) == str(TESTS / "conftest.py"):
            sys.modules["conftest"] = plugin


@pytest.fixture(scope="session")
def private_pg_server() -> Iterator[FaultPostgres]:
    srv = FaultPostgres()
    try:
        srv.start()
        yield srv
    finally:
        srv.cleanup()


@pytest.fixture(scope="session")
def private_redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("faults-redis")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=BACKEND_NAMES)
def fault_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FaultStore]:
    """A fresh store of each backend in turn (private servers for PostgreSQL and Redis)."""
    with open_fault_store(request.param, request, tmp_path) as store:
        yield store


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """``make_cluster(url, env=..., url_for=...)``: a worker cluster whose side-effect log is in tmp_path;
    every process it started is SIGKILLed at the end of the test."""
    made: list[Cluster] = []

    def make(url: str, *, env: dict[str, str] | None = None, log: Path | None = None,
             url_for: Callable[[str], str] | None = None) -> Cluster:
        c = Cluster(tmp_path, url, log or tmp_path / f"effects{len(made)}.jsonl", env=env, url_for=url_for)
        made.append(c)
        return c

    try:
        yield make
    finally:
        for c in made:
            c.close()
