"""The conformance suite's stores: every backend of tests/stores.py, and the message brokers
(RabbitMQ, SQS on moto's server) alone and with a companion store (``state=``).

A broker lacks capabilities a store has (``Backend.missing``: core.MISSING alone,
companion.MISSING_WITH_STATE with a companion store); a test that needs one is marked
``@pytest.mark.needs(...)`` and deselected on such a param (tests/conftest.py counts them).

Not every broker param runs every file (``FILES``), to keep the suite's time in CI's budget:
each broker alone and RabbitMQ with SQLite run them all (but test_take.py and test_outbox.py:
``take`` and the outbox are the interfaces a store offers a broker's companion, which a broker
does not offer; and alone, most tests are
deselected anyway); the other params run ``CORE``, the files
whose tests go through the broker's own code with the store (enqueue, claim, leases, retries,
fencing, the worker, waits). The companion's records are the store's, whose conformance the
store params test in full, and the broker suite (tests/brokers) tests each broker's semantics.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from brokerstores import RABBITMQ_URL, rabbitmq_prefix, sqs_endpoint  # noqa: F401 - a fixture
from stores import BACKENDS, BackendUnavailable, _unavailable, also_ran

from conveyor.backends.broker.companion import MISSING_WITH_STATE
from conveyor.backends.broker.core import MISSING

# Yields (url, state) for a fresh store; state is a broker's companion store, or None.
Opener = Callable[[pytest.FixtureRequest, Path, contextlib.ExitStack[None]], tuple[str, str | None]]


@dataclass(frozen=True)
class StoreParam:
    name: str
    open: Opener
    missing: frozenset[str] = frozenset()  # the capabilities this store lacks

    def __str__(self) -> str:
        return self.name


def _plain(spec_store: Callable[[Path], contextlib.AbstractContextManager[str]]) -> Opener:
    def open_(request: pytest.FixtureRequest, tmp_path: Path,
              stack: contextlib.ExitStack[None]) -> tuple[str, str | None]:
        return stack.enter_context(spec_store(tmp_path)), None

    return open_


def _rabbitmq(request: pytest.FixtureRequest, tmp_path: Path,
              stack: contextlib.ExitStack[None]) -> str:
    prefix = stack.enter_context(rabbitmq_prefix())
    return f"{RABBITMQ_URL}?prefix={prefix}&expires=60000"


def _sqs(request: pytest.FixtureRequest, tmp_path: Path,
         stack: contextlib.ExitStack[None]) -> str:
    endpoint = request.getfixturevalue("sqs_endpoint")
    return f"sqs://{endpoint}/?prefix=t{uuid.uuid4().hex[:16]}&levels=-1,0,1"


_BROKERS = {"rabbitmq": _rabbitmq, "sqs": _sqs}
_STATES = {spec.name: spec.store for spec in BACKENDS}


def _broker(name: str) -> StoreParam:
    broker, _, state = name.partition("+")

    def open_(request: pytest.FixtureRequest, tmp_path: Path,
              stack: contextlib.ExitStack[None]) -> tuple[str, str | None]:
        url = _BROKERS[broker](request, tmp_path, stack)
        also_ran.add(broker)
        return url, stack.enter_context(_STATES[state](tmp_path)) if state else None

    return StoreParam(name, open_, MISSING_WITH_STATE if state else MISSING)


STORES = [StoreParam(spec.name, _plain(spec.store), spec.missing) for spec in BACKENDS]
BROKERS = [_broker(name) for name in ("rabbitmq+sqlite", "rabbitmq+postgres", "rabbitmq+redis",
                                      "sqs+sqlite", "rabbitmq", "sqs")]


ALL_BUT_TAKE = None  # every file but the store's side of a companion (STORE_SIDE)
STORE_SIDE = frozenset({"test_take.py", "test_outbox.py"})
CORE = frozenset({
    "test_ack_and_claim.py", "test_attempts_started.py", "test_backend_concurrency.py",
    "test_backend_enqueue_claim.py", "test_backend_leases.py", "test_app_worker.py",
    "test_wait.py",
})
FILES: dict[str, frozenset[str] | None] = {
    "rabbitmq": ALL_BUT_TAKE, "rabbitmq+sqlite": ALL_BUT_TAKE, "rabbitmq+postgres": CORE,
    "rabbitmq+redis": CORE, "sqs": ALL_BUT_TAKE, "sqs+sqlite": CORE,
}


def _runs(param: StoreParam, file: str) -> bool:
    if param in STORES:
        return True
    files = FILES[param.name]
    return file not in STORE_SIDE if files is None else file in files


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "conformance_store" in metafunc.fixturenames:
        params = [p for p in (*STORES, *BROKERS) if _runs(p, metafunc.definition.path.name)]
        metafunc.parametrize("conformance_store", params, ids=[p.name for p in params],
                             indirect=True)


@pytest.fixture
def conformance_store(request: pytest.FixtureRequest,
                      tmp_path: Path) -> Iterator[tuple[str, str | None]]:
    param: StoreParam = request.param
    with contextlib.ExitStack() as stack:
        try:
            yield param.open(request, tmp_path, stack)
        except BackendUnavailable as exc:
            _unavailable(param.name, exc)


@pytest.fixture
def store_url(conformance_store: tuple[str, str | None]) -> str:
    return conformance_store[0]


@pytest.fixture
def store_state(conformance_store: tuple[str, str | None]) -> str | None:
    return conformance_store[1]
