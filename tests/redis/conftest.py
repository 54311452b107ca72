"""Fixtures of the Redis-specific tests: a private redis-server per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from redisrig import RedisServer


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of our own with AOF (appendfsync everysec), killed at the end."""
    server = RedisServer(tmp_path).start()
    try:
        yield server
    finally:
        server.stop()
