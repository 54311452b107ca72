"""A fresh, empty store for one test, deleted afterwards; and an app pointed at it meanwhile.

SQLite: a file in the test's directory. PostgreSQL: a schema of its own in the database the
URL names (``search_path``), dropped afterwards. Redis: a key prefix of its own in the
database the URL names (on a cluster URL, in whichever slot it hashes to), its keys deleted
afterwards. Each holds only what its test wrote, so
tests can run side by side on one server (pytest-xdist, CI jobs sharing a service).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from ..app import Conveyor
from ..backends.base import Backend
from ..errors import ConfigurationError

# The name of every schema and key prefix made here starts with this: a crashed run's
# leftovers are easy to find (and never mistaken for a real store).
NAME_PREFIX = "conveyor_pytest_"


def _with_query(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
             if k not in params]
    return parts._replace(query=urlencode(query + list(params.items()))).geturl()


@contextlib.contextmanager
def temporary_store(base_url: str | None, directory: str | Path) -> Iterator[str]:
    """The URL of a fresh, empty store like ``base_url`` (None or a SQLite URL: a SQLite file
    in ``directory``), deleted when the block ends."""
    scheme = urlsplit(base_url).scheme if base_url else "sqlite"
    name = f"{NAME_PREFIX}{uuid.uuid4().hex[:12]}"
    if scheme == "sqlite":
        yield f"sqlite:///{Path(directory).absolute() / name}.db"
    elif scheme in ("postgresql", "postgres"):
        assert base_url is not None
        with _postgres_schema(base_url, name) as url:
            yield url
    elif scheme in ("redis", "rediss", "unix"):
        assert base_url is not None
        with _redis_prefix(base_url, name) as url:
            yield url
    elif scheme in ("redis+cluster", "rediss+cluster"):
        assert base_url is not None
        with _redis_cluster_prefix(base_url, name) as url:
            yield url
    else:
        raise ConfigurationError(f"no temporary store for {scheme!r} URLs "
                                 "(sqlite, postgresql and redis have one)")


@contextlib.contextmanager
def _postgres_schema(base_url: str, schema: str) -> Iterator[str]:
    import psycopg

    if "options" in dict(parse_qsl(urlsplit(base_url).query)):
        raise ConfigurationError("a temporary PostgreSQL store sets the URL's options= "
                                 "(search_path): leave it out of the base URL")
    with psycopg.connect(base_url, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        try:
            yield _with_query(base_url, options=f"-csearch_path={schema}")
        finally:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


@contextlib.contextmanager
def _redis_prefix(base_url: str, prefix: str) -> Iterator[str]:
    import redis

    from ..backends.redis.partitions import partitions_of
    from ..backends.redis.transport import parse_redis_url

    # The server's URL without our own options (prefix, partitions, timeouts), for redis-py.
    client = redis.Redis.from_url(parse_redis_url(partitions_of(base_url)[1])[1],
                                  socket_timeout=5, socket_connect_timeout=5)
    try:
        client.ping()
        yield _with_query(base_url, prefix=prefix)
    finally:
        try:
            # Every key of a store is named {prefix}... ({prefix#p}... in a partitioned app's
            # partition p): only this test's keys go.
            for pattern in (f"{{{prefix}}}*", f"{{{prefix}#*"):
                keys = list(client.scan_iter(match=pattern, count=1000))
                for start in range(0, len(keys), 500):
                    client.delete(*keys[start:start + 500])
        finally:
            client.close()


@contextlib.contextmanager
def _redis_cluster_prefix(base_url: str, prefix: str) -> Iterator[str]:
    """As _redis_prefix, on a Redis Cluster: through a backend, which finds the node that
    serves the prefix's slot."""
    from ..backends import open_backend
    from ..backends.redis import RedisBackend

    url = _with_query(base_url, prefix=prefix)
    backend = open_backend(url)
    # A partitioned app (partitions=N) is N apps of the plain layout, each in its own slot.
    parts = getattr(backend, "parts", [backend])
    assert all(isinstance(part, RedisBackend) for part in parts)
    try:
        backend.now()  # reachable: StoreUnavailable if not
        yield url
    finally:
        try:
            for part in parts:
                t = part._transport
                tag = "{" + part.prefix + "}"

                def delete(t: Any = t, tag: str = tag) -> None:
                    # Every key of the app carries its hash tag: one slot, so one node, the one
                    # its connections go to (SCAN has no key to be redirected by).
                    keys = list(t.r.scan_iter(match=f"{tag}*", count=1000))
                    for start in range(0, len(keys), 500):
                        t.r.delete(*keys[start:start + 500])

                t.call("delete the store", delete, safe=True)
        finally:
            backend.close()


@contextlib.contextmanager
def using_store(app: Conveyor, url: str) -> Iterator[Conveyor]:
    """Point ``app`` (and so its tasks' ``enqueue``) at the store ``url`` for the block, then
    back at its own store, closing the one used meanwhile. The same app object, so the tasks
    a module registered on it are all there."""
    saved_url, saved_backend = _swap(app, url, None)
    try:
        yield app
    finally:
        _, used = _swap(app, saved_url, saved_backend)
        if used is not None:
            used.close()


def _swap(app: Conveyor, url: str, backend: Backend | None) -> tuple[str, Backend | None]:
    """Set the app's store (its URL and open backend, None: opened on first use); return the
    ones it had."""
    with app._lock:
        old = app.url, app._backend
        app.url, app._backend = url, backend
    return old
