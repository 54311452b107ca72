"""Stores. ``open_backend(url)`` picks one by the URL's scheme."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit

from ..errors import ConfigurationError
from .base import Backend


def open_backend(url: str, *, pool_size: int | None = None, state: str | None = None) -> Backend:
    """``pool_size``: PostgreSQL's connection pool, fixed (see PostgresBackend); other stores
    have none to size. ``state``: a broker's companion store (broker/companion.py), the URL
    of a SQLite, PostgreSQL or Redis store that keeps the job records; only with a broker."""
    scheme = urlsplit(url).scheme
    if state is not None and scheme not in BROKER_SCHEMES:
        raise ConfigurationError(
            f"state= names a companion store for a message broker (amqp://, sqs://); "
            f"{redact_url(url)!r} is a store of its own")
    if scheme == "sqlite":
        from .sqlite import SqliteBackend

        return SqliteBackend(url)
    if scheme in ("postgresql", "postgres"):
        _require("psycopg", "postgres")
        from .postgres import PostgresBackend

        return PostgresBackend(url, max_size=pool_size)
    if scheme in ("redis", "rediss", "redis+cluster", "rediss+cluster"):
        _require("redis", "redis")
        from .redis import RedisBackend
        from .redis.partitions import PartitionedRedis, partitions_of

        if partitions_of(url)[0] > 1:
            return PartitionedRedis(url)

        return RedisBackend(url)
    if scheme in ("amqp", "amqps"):
        _require("pika", "rabbitmq")
        from .broker.rabbitmq import open_rabbitmq

        return open_rabbitmq(url, state=_companion(state, pool_size))
    if scheme == "sqs":
        _require("boto3", "sqs")
        from .broker.sqs import open_sqs

        return open_sqs(url, state=_companion(state, pool_size))
    raise ConfigurationError(
        f"unsupported store URL {redact_url(url)!r}: expected sqlite:///file.db, "
        "postgresql://user@host/db, redis://host:6379/0, redis+cluster://host:port,host:port, "
        "amqp://user:pass@host/vhost or sqs://"
    )


def absolute_url(url: str) -> str:
    """``url`` with a relative SQLite path made absolute against the current directory.

    A relative path names a different file in every directory a process starts in: a
    producer and a worker started in two places would silently use two stores.
    Other URLs, absolute paths and URLs that are not valid SQLite URLs are returned as
    given (opening the store reports what is wrong with them).
    """
    parts = urlsplit(url)
    if parts.scheme != "sqlite" or (parts.netloc + parts.path).startswith("//"):
        return url
    from .sqlite import parse_sqlite_url

    try:
        path, _ = parse_sqlite_url(url)
    except ConfigurationError:
        return url
    return f"sqlite:///{path}" + (f"?{parts.query}" if parts.query else "")


def sqlite_path(url: str) -> str | None:
    """The absolute file path of a SQLite store URL; None for other stores or invalid URLs."""
    if urlsplit(url).scheme != "sqlite":
        return None
    from .sqlite import parse_sqlite_url

    try:
        return parse_sqlite_url(url)[0]
    except ConfigurationError:
        return None


BROKER_SCHEMES = ("amqp", "amqps", "sqs")


def _companion(state: str | None, pool_size: int | None) -> Backend | None:
    if state is None:
        return None
    if urlsplit(state).scheme in BROKER_SCHEMES:
        raise ConfigurationError(f"state= is a store for the job records (sqlite://, "
                                 f"postgresql://, redis://), not {redact_url(state)!r}")
    return open_backend(state, pool_size=pool_size)


def _require(module: str, extra: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ConfigurationError(
            f"this store needs the {module!r} package: pip install 'conveyor[{extra}]'")


SECRET_PARAMS = {"password", "sslpassword", "pass", "token"}


def redact_url(url: str) -> str:
    """The URL with any password (in the netloc or the query) replaced, for logs and screens."""
    parts = urlsplit(url)
    secret_query = any(k.lower() in SECRET_PARAMS for k, _ in parse_qsl(parts.query))
    if parts.password is None and not secret_query:
        return url  # untouched: geturl() would normalise sqlite://// away
    if parts.password is not None:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
        parts = parts._replace(netloc=netloc)
    if parts.query:
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        if any(k.lower() in SECRET_PARAMS for k, _ in pairs):
            masked = [(k, "***" if k.lower() in SECRET_PARAMS else v) for k, v in pairs]
            parts = parts._replace(query=urlencode(masked, safe="*"))
    return parts.geturl()
