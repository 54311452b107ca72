"""Fixtures for the dashboard tests: the dashboard on each real store, and an HTTP client that
talks to it from loopback (helpers are in dashkit.py).

HTTP-level tests use Starlette's TestClient against the ``app`` fixture, so they run on
SQLite, PostgreSQL and Redis; the browser tests run a real server on SQLite.
"""

from __future__ import annotations

import subprocess
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


@pytest.fixture(scope="session")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A certificate for 127.0.0.1 and its key (PEM files), made by openssl as an operator would."""
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return str(cert), str(key)
