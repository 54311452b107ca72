"""Stores on message brokers, for the broker suite (tests/brokers; its conftest.py takes the
fixtures from here, and the tests import the rest from here: a module named ``conftest``
is whichever directory's conftest pytest loaded last): one fresh set of queues per
test on each broker. A broker whose server cannot be reached skips locally and fails the run
under CI=true, as the stores of the conformance suite do (tests/stores.py).

Each broker also says how a holder loses a message (``lose``): RabbitMQ's lease is the
connection, so the holder's connection is cut; SQS's is the visibility timeout, so the test
waits it out.

SQS's server in the tests is moto's (the moto[server] package), started once per session as a
process of its own on a free loopback port, never an in-process mock of the client; each test
gets its own queue-name prefix on it. At the end only that server is stopped, by its pid.
Broker ``sqs-fifo`` is the same server with ``fifo=true`` (FIFO lanes, message groups, delay
queues), so the whole suite runs on FIFO queues too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from stores import (
    BackendUnavailable,
    StoreFactory,
    _unavailable,
    also_ran,
    postgres_migrated_store,
    redis_store,
    sqlite_store,
)

from conveyor.backends import open_backend
from conveyor.backends.base import Backend
from conveyor.backends.broker import BrokerBackend
from conveyor.backends.broker.sqs import SqsTransport
from conveyor.backends.broker.sqs_settings import parse_sqs_url

RABBITMQ_URL = os.environ.get("CONVEYOR_TEST_RABBITMQ_URL",
                              "amqp://guest:guest@127.0.0.1:5672/%2F")


@dataclass(frozen=True)
class Broker:
    name: str
    url: str
    lease_s: float  # the lease the tests claim with
    lose: Callable[[Backend, float], None]  # make ``backend`` lose what it holds
    state: str | None = None  # the companion store's URL, if any

    @property
    def companion(self) -> bool:
        return self.state is not None


def rabbitmq_broker(tmp_path: Path) -> Broker:
    import pika

    try:
        pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL + "?connection_attempts=1"
                                                   "&socket_timeout=3")).close()
    except Exception as exc:
        raise BackendUnavailable(f"cannot connect to RabbitMQ at 127.0.0.1:5672: {exc}") from exc

    def lose(backend: Backend, lease_s: float) -> None:
        # The connection is the lease: cut it as a killed worker's would be.
        backend.transport._drop()  # type: ignore[attr-defined]

    # Queues of a test expire a minute after their last use: tests share the server.
    prefix = f"ct{uuid.uuid4().hex[:10]}"
    return Broker("rabbitmq", f"{RABBITMQ_URL}?prefix={prefix}&expires=60000", 30.0, lose)


def sqs_broker(request: pytest.FixtureRequest, *, fifo: bool = False) -> Broker:
    endpoint = request.getfixturevalue("sqs_endpoint")

    def lose(backend: Backend, lease_s: float) -> None:
        # The visibility timeout is the lease: wait it out (no heartbeat meanwhile).
        time.sleep(lease_s + 0.5)

    prefix = f"t{uuid.uuid4().hex[:16]}"
    if fifo:
        return Broker("sqs-fifo", f"sqs://{endpoint}/?prefix={prefix}&levels=-1,0,1&fifo=true",
                      2.0, lose)
    return Broker("sqs", f"sqs://{endpoint}/?prefix={prefix}&levels=-1,0,1", 2.0, lose)


BROKERS: dict[str, Callable[[pytest.FixtureRequest, Path], Broker]] = {
    "rabbitmq": lambda request, tmp_path: rabbitmq_broker(tmp_path),
    "sqs": lambda request, tmp_path: sqs_broker(request),
    # FIFO queues (?fifo=true): the same suite, on message groups and the delay queues.
    "sqs-fifo": lambda request, tmp_path: sqs_broker(request, fifo=True),
}
# Each broker alone, and with a companion store of each kind (broker/companion.py).
COMPANIONS: dict[str, StoreFactory] = {
    "sqlite": sqlite_store, "postgres": postgres_migrated_store, "redis": redis_store}
ALONE = sorted(BROKERS)
# RabbitMQ with each store; the SQS brokers with SQLite's. The companion's logic is one for every
# broker (broker/companion.py) and each store's take has its own conformance tests
# (tests/conformance/test_take.py): the full matrix would add minutes to every run, not cases.
WITH_STATE = [*(f"rabbitmq+{s}" for s in COMPANIONS),
              *(f"{b}+sqlite" for b in sorted(BROKERS) if b != "rabbitmq")]
PARAMS = [*ALONE, *WITH_STATE]
# A test of what only a broker alone does (its dead lane, its refusals), or only a companion
# adds, takes these instead of every combination: ``@alone`` / ``@with_state``.
alone = pytest.mark.parametrize("broker", ALONE, indirect=True)
with_state = pytest.mark.parametrize("broker", WITH_STATE, indirect=True)


@pytest.fixture(params=PARAMS)
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Broker]:
    name, _, store = str(request.param).partition("+")
    with contextlib.ExitStack() as stack:
        try:
            found = BROKERS[name](request, tmp_path)
            also_ran.add(name)
            if store:
                state = stack.enter_context(COMPANIONS[store](tmp_path))
                found = dataclasses.replace(found, name=request.param, state=state)
        except BackendUnavailable as exc:
            _unavailable(store if store and name in also_ran else name, exc)
        yield found


@pytest.fixture
def open_broker(broker: Broker) -> Iterator[Callable[[], Backend]]:
    """Open backends on the test's broker queues (several: a zombie and its successor)."""
    opened: list[Backend] = []

    def make() -> Backend:
        b = open_backend(broker.url, state=broker.state)
        opened.append(b)
        return b

    yield make
    for b in opened:
        b.close()


def wait_for(fn: Callable[[], object], timeout: float = 15.0) -> object:
    """Poll ``fn`` until it returns something truthy; fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout}s")
        time.sleep(0.05)


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

