"""Fixtures of the Redis-specific tests: a private redis-server per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from clusterrig import LocalCluster, local_cluster
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


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One local Redis Cluster (3 masters, 3 replicas) for the session's cluster tests; a
    test that moves a slot or fails a node over leaves it healthy for the next."""
    with local_cluster(tmp_path_factory.mktemp("redis-cluster")) as cluster:
        yield cluster
