"""The fixture of the ``test_cluster_partitioned_*`` files here: a fresh app of six partitions on
the local cluster, so its queues spread over the three masters (backends/redis/partitions.py).
Its param carries what the app lacks (``cross_queue``), so tests that need it are deselected as
on the ``redis-partitioned`` store of tests/stores.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from clusterrig import LocalCluster

from conveyor.backends.redis.partitions import PartitionedRedis

PARTITIONS = 6


@dataclass(frozen=True)
class Partitioned:
    partitions: int = PARTITIONS
    missing: frozenset[str] = PartitionedRedis.missing

    def __str__(self) -> str:
        return f"partitioned-{self.partitions}"


@pytest.fixture(params=[Partitioned()], ids=str)
def store_url(request: pytest.FixtureRequest, redis_cluster: LocalCluster) -> Iterator[str]:
    prefix = f"conveyor_test_{uuid.uuid4().hex[:12]}"
    try:
        yield redis_cluster.url(prefix, query=f"&partitions={request.param.partitions}")
    finally:
        for p in range(request.param.partitions):
            redis_cluster.delete_prefix(f"{prefix}#{p}")
