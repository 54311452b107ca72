"""Fixtures of the Redis-specific tests: a private redis-server per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from redisrig import RedisServer

from conveyor.backends import open_backend
from conveyor.backends.redis import RedisBackend


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of our own with AOF (appendfsync everysec), killed at the end."""
    server = RedisServer(tmp_path).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def backend(private_redis: RedisServer) -> Iterator[RedisBackend]:
    """A Redis backend on the test's private server (the root conftest's ``backend`` is one per
    store; the tests here are Redis's own)."""
    b = open_backend(private_redis.url)
    assert isinstance(b, RedisBackend)
    try:
        yield b
    finally:
        b.close()
