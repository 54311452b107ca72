"""Stores on message brokers, for the broker suite (tests/brokers; its conftest.py takes the
fixtures from here, and the tests import the rest from here: a module named ``conftest``
is whichever directory's conftest pytest loaded last): one fresh set of queues per
test on each broker. A broker whose server cannot be reached skips locally and fails the run
under CI=true, as the stores of the conformance suite do (tests/stores.py).

Each broker also says how a holder loses a message (``lose``): RabbitMQ's lease is the
connection, so the holder's connection is cut; SQS's is the visibility timeout, so the test
waits it out.

The servers (a RabbitMQ prefix per test, deleted at its end; moto's SQS server, one per
session) come from tests/brokerstores.py, which the conformance suite shares. Broker ``sqs-fifo`` is the same server with ``fifo=true`` (FIFO lanes, message groups, delay
queues), so the whole suite runs on FIFO queues too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from brokerstores import RABBITMQ_URL, rabbitmq_prefix
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


def rabbitmq_broker(stack: contextlib.ExitStack[None]) -> Broker:
    def lose(backend: Backend, lease_s: float) -> None:
        # The connection is the lease: cut it as a killed worker's would be.
        backend.transport._drop()  # type: ignore[attr-defined]

    # Deleted at the end of the test (brokerstores.py); a minute after their last use they
    # would expire anyway.
    prefix = stack.enter_context(rabbitmq_prefix())
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


BROKERS: dict[str, Callable[[pytest.FixtureRequest, contextlib.ExitStack[None]], Broker]] = {
    "rabbitmq": lambda request, stack: rabbitmq_broker(stack),
    "sqs": lambda request, stack: sqs_broker(request),
    # FIFO queues (?fifo=true): the same suite, on message groups and the delay queues.
    "sqs-fifo": lambda request, stack: sqs_broker(request, fifo=True),
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
            found = BROKERS[name](request, stack)
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

