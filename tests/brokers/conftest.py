"""Stores on message brokers, for the broker suite (tests/brokers): one fresh set of queues per
test on each broker. A broker whose server cannot be reached skips locally and fails the run
under CI=true, as the stores of the conformance suite do (tests/stores.py).

Each broker also says how a holder loses a message (``lose``): RabbitMQ's lease is the
connection, so the holder's connection is cut; SQS's is the visibility timeout, so the test
waits it out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
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

from conveyor.backends.base import Backend

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


BROKERS: dict[str, Callable[[Path], Broker]] = {"rabbitmq": rabbitmq_broker}
# Each broker alone, and with a companion store of each kind (broker/companion.py).
COMPANIONS: dict[str, StoreFactory] = {
    "sqlite": sqlite_store, "postgres": postgres_migrated_store, "redis": redis_store}
ALONE = sorted(BROKERS)
WITH_STATE = [f"{b}+{s}" for b in sorted(BROKERS) for s in COMPANIONS]
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
            found = BROKERS[name](tmp_path)
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
    from conveyor.backends import open_backend

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
