"""The conformance suite's files named in this directory, run on the local Redis Cluster.

Each ``test_cluster_<name>.py`` here takes the tests (and module fixtures) of
``tests/conformance/<name>.py`` as its own (conformance.py); the fixtures below point them at a
fresh app on the session's cluster (``redis_cluster``, tests/redis/conftest.py) through a
``redis+cluster://`` URL that lists every node, so they go through the cluster client: the
slot's owner found from the seeds, MOVED followed. Not the whole suite, to keep `make test`
short: enqueue and claim, leases, admin, waits, the worker; and the files whose scripts make
keys past the ones they declare (limits, workflows, history), the loop claims (ack_and_claim),
and a backend's life (fork, close, concurrency, pause). CONVEYOR_TEST_REDIS_CLUSTER_URL adds a
``redis-cluster`` store to every conformance test instead (tests/stores.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from clusterrig import LocalCluster, cluster_store

from conveyor.backends import open_backend
from conveyor.backends.base import Backend


@pytest.fixture
def store_url(redis_cluster: LocalCluster) -> Iterator[str]:
    with cluster_store(redis_cluster) as url:
        yield url


@pytest.fixture
def backend(store_url: str) -> Iterator[Backend]:
    b = open_backend(store_url)
    try:
        yield b
    finally:
        b.close()
