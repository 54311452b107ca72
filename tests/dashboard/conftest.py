"""Fixtures for the dashboard tests: the dashboard on each real store, and an HTTP client that
talks to it from loopback (helpers are in dashkit.py).

HTTP-level tests use Starlette's TestClient against the ``app`` fixture, so they run on
SQLite, PostgreSQL and Redis; the browser tests run a real server on SQLite.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dashkit import make_client
from starlette.testclient import TestClient

from conveyor import Conveyor
from conveyor.dashboard import DashboardApp, create_app


@pytest.fixture
def dash(app: Conveyor) -> Iterator[DashboardApp]:
    """The dashboard on the test's store, without authentication (loopback only)."""
    d = create_app(app, sample_interval=3600)  # tests sample by hand: no background thread surprises
    try:
        yield d
    finally:
        d.close()


@pytest.fixture
def client(dash: DashboardApp) -> Iterator[TestClient]:
    with make_client(dash) as c:
        yield c
