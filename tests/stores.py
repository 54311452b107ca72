"""The stores the tests run against: one fresh, empty store per test (or per example),
for every backend. Importable as ``stores`` (tests/ is on sys.path); conftest.py builds the
``store_url``/``backend``/``app`` fixtures on it.

Adding a backend is two steps: write a ``<name>_store(tmp_path)`` context manager that yields
a URL for a fresh, empty store (raising :class:`BackendUnavailable` if its service cannot be
reached) and add one ``BackendSpec`` line to ``BACKENDS``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import pytest

if TYPE_CHECKING:
    from pgtemplate import TemplateSchema


class BackendUnavailable(Exception):
    """The backend's service cannot be reached from this machine."""


StoreFactory = Callable[[Path], contextlib.AbstractContextManager[str]]


@dataclass(frozen=True)
class BackendSpec:
    name: str
    # Yields the URL of a fresh store with no jobs (its schema may be there already: see
    # postgres_migrated_store); cleans it up afterwards.
    store: StoreFactory
    # The capabilities its backend lacks (Backend.missing): tests that need one are deselected.
    missing: frozenset[str] = frozenset()


@contextlib.contextmanager
def sqlite_store(tmp_path: Path) -> Iterator[str]:
    yield f"sqlite:///{tmp_path}/c.db"


POSTGRES_URL = os.environ.get("CONVEYOR_TEST_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/test")


@contextlib.contextmanager
def postgres_store(tmp_path: Path) -> Iterator[str]:
    """A fresh, empty schema in the machine's PostgreSQL (the first open_backend migrates it),
    dropped afterwards: for the tests that migrate a store themselves."""
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


_template: TemplateSchema | None = None
_template_lock = threading.Lock()


def _postgres_template() -> TemplateSchema:
    """The session's template schema, migrated on first use."""
    global _template
    import psycopg
    from pgtemplate import TemplateSchema

    with _template_lock:
        if _template is None:
            try:
                _template = TemplateSchema(POSTGRES_URL).start()
            except psycopg.OperationalError as exc:
                raise BackendUnavailable(f"cannot connect to {POSTGRES_URL}: {exc}") from exc
            atexit.register(close_postgres_template)
        return _template


def close_postgres_template() -> None:
    """Drop the session's template schema and its copies (conftest.py calls it at the end)."""
    global _template
    with _template_lock:
        template, _template = _template, None
    if template is not None:
        template.close()


@contextlib.contextmanager
def postgres_migrated_store(tmp_path: Path) -> Iterator[str]:
    """A fresh store already migrated: a copy of the session's template schema (see
    pgtemplate.py), dropped afterwards. The conformance suite's PostgreSQL store; tests of the
    migrations themselves use ``postgres_store``, which starts empty."""
    template = _postgres_template()
    name = template.take()
    try:
        yield template.url(name)
    finally:
        template.give_back(name)


REDIS_URL = os.environ.get("CONVEYOR_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@contextlib.contextmanager
def redis_store(tmp_path: Path, partitions: int = 1) -> Iterator[str]:
    """A fresh key prefix per test in the machine's Redis; its keys are deleted afterwards.
    With ``partitions``, an app of that many partitions (backends/redis/partitions.py)."""
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
        yield f"{REDIS_URL}{sep}prefix={prefix}" + (
            f"&partitions={partitions}" if partitions > 1 else "")
    finally:
        # Only this test's keys ({prefix}... and a partitioned app's {prefix#p}...); the server
        # is shared. The pattern has no glob characters but *.
        keys = list(client.scan_iter(match=f"{{{prefix}*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start:start + 500])
        client.close()


# A Redis Cluster to run the whole suite on as well (redis+cluster://host:port,host:port/), when
# set: not by default, the suite takes long enough; tests/redis/on_cluster runs five of its
# files on a cluster it starts itself in every run.
REDIS_CLUSTER_URL = os.environ.get("CONVEYOR_TEST_REDIS_CLUSTER_URL", "")


@contextlib.contextmanager
def redis_cluster_store(tmp_path: Path) -> Iterator[str]:
    """A fresh key prefix (so a slot of its own) per test on the cluster; its keys are deleted
    afterwards on the node that owns the slot then."""
    import uuid

    import redis
    from redis.crc import key_slot

    from conveyor.backends.redis.cluster import node_url, read_slots, seeds_of

    prefix = f"conveyor_test_{uuid.uuid4().hex[:12]}"
    slot = key_slot(("{" + prefix + "}").encode())

    def owner() -> redis.Redis:
        for host, port in seeds_of(REDIS_CLUSTER_URL):
            seed = redis.Redis.from_url(node_url(REDIS_CLUSTER_URL, host, port), socket_timeout=2,
                                        socket_connect_timeout=1)
            try:
                where, _ = read_slots(seed.execute_command("CLUSTER", "SLOTS"), slot, host)
            except redis.RedisError:
                continue
            finally:
                seed.close()
            if where is not None:
                return redis.Redis.from_url(node_url(REDIS_CLUSTER_URL, *where), socket_timeout=5)
        raise BackendUnavailable(f"no node of {REDIS_CLUSTER_URL} answers CLUSTER SLOTS")

    owner().close()
    sep = "&" if "?" in REDIS_CLUSTER_URL else "?"
    try:
        yield f"{REDIS_CLUSTER_URL}{sep}prefix={prefix}"
    finally:
        client = owner()
        try:  # only this test's keys (another prefix may share the slot)
            keys = list(client.scan_iter(match=f"{{{prefix}}}*", count=1000))
            for start in range(0, len(keys), 500):
                client.delete(*keys[start:start + 500])
        finally:
            client.close()


BACKENDS: list[BackendSpec] = [
    BackendSpec("sqlite", sqlite_store),
    BackendSpec("postgres", postgres_migrated_store),
    BackendSpec("redis", redis_store),
    *([BackendSpec("redis-cluster", redis_cluster_store)] if REDIS_CLUSTER_URL else []),
    # One app over four partitions on the same server: the router (partitions.py) under every
    # conformance test; tests/redis/on_cluster runs it on a real cluster's shards.
    BackendSpec("redis-partitioned", functools.partial(redis_store, partitions=4),
                missing=frozenset({"cross_queue"})),
]


NOT_YET_IMPLEMENTED: list[str] = []
_skipped: dict[str, str] = {}
# Stores outside BACKENDS that tests of this run reached (the brokers of tests/brokers).
also_ran: set[str] = set()


def _unavailable(name: str, exc: BackendUnavailable) -> NoReturn:
    reason = f"{name} backend unavailable: {exc}"
    _skipped[name] = str(exc)
    if os.environ.get("CI") == "true":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


