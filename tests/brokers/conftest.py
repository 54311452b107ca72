"""The SQS tests' server: moto's SQS-compatible server (the moto[server] package), started once
per session as a process of its own on a free loopback port, never an in-process mock of the
client. Each test gets its own queue-name prefix on it, so tests never see each other's queues.

If the server cannot start, the tests are skipped locally and fail under CI=true
(stores._unavailable). At the end only the server this fixture started is stopped, by its pid.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from stores import BackendUnavailable, _unavailable

from conveyor.backends import open_backend
from conveyor.backends.broker import BrokerBackend
from conveyor.backends.broker.sqs import SqsTransport
from conveyor.backends.broker.sqs_settings import parse_sqs_url

START_TIMEOUT = 30.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


@contextlib.contextmanager
def moto_server(log_dir: Path) -> Iterator[str]:
    """A moto server on a free loopback port; yields ``host:port``."""
    port = _free_port()
    log_path = log_dir / "moto_server.log"
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        except OSError as exc:
            raise BackendUnavailable(f"cannot start moto's server: {exc}") from exc
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not _answers(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise BackendUnavailable(
                    f"moto's server did not start on 127.0.0.1:{port} "
                    f"(exit code {proc.poll()}): {tail}")
            time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@pytest.fixture(scope="session")
def sqs_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``host:port`` of the session's SQS server. moto takes any credentials; these keep boto3
    from looking for the machine's own (and from signing with them)."""
    home = tmp_path_factory.mktemp("sqs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_ACCESS_KEY_ID", "conveyor-test")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "conveyor-test")
        mp.setenv("AWS_CONFIG_FILE", str(home / "no-config"))
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(home / "no-credentials"))
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL",
                     "AWS_ENDPOINT_URL_SQS"):
            mp.delenv(name, raising=False)
        with contextlib.ExitStack() as stack:
            try:
                endpoint = stack.enter_context(moto_server(home))
            except BackendUnavailable as exc:
                _unavailable("sqs", exc)
            yield endpoint


@pytest.fixture
def sqs_url(sqs_endpoint: str) -> str:
    """An sqs:// URL with a prefix of its own and three priority levels."""
    return f"sqs://{sqs_endpoint}/?prefix=t{uuid.uuid4().hex[:16]}&levels=-1,0,1"


@pytest.fixture
def sqs_backend(sqs_url: str) -> Iterator[BrokerBackend]:
    b = open_backend(sqs_url)
    assert isinstance(b, BrokerBackend)
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def transport(sqs_url: str) -> Iterator[SqsTransport]:
    t = SqsTransport(parse_sqs_url(sqs_url))
    try:
        yield t
    finally:
        t.close()


@pytest.fixture
def sqs_client(sqs_endpoint: str) -> object:
    """A plain boto3 client on the server, to look at queues from outside the transport."""
    import boto3

    return boto3.client("sqs", endpoint_url=f"http://{sqs_endpoint}", region_name="us-east-1")

