"""A partitioned app's idle waits on Redis Cluster (backends/redis/wakes.py): one subscribed
connection per node that serves a partition waited on, and a slot moved while a worker waits
neither loses a wake-up nor leaves the wait subscribed to a node that no longer serves it.

The cluster is the session's (``redis_cluster``); the test moves one slot and leaves the
cluster healthy.
"""

from __future__ import annotations

import time
import uuid

from clusterrig import LocalCluster
from support import new_job
from test_redis_grouped_waits import Wait, one_per_partition

from conveyor.backends import open_backend
from conveyor.backends.redis.partitions import PartitionedRedis

N = 6


def settle(b: PartitionedRedis, subscribed: int) -> None:
    deadline = time.monotonic() + 10
    while b._hub.subscriptions() < subscribed:
        assert time.monotonic() < deadline, "the wake channels were never confirmed"
        time.sleep(0.01)
    time.sleep(0.2)


def test_grouped_waits_take_a_connection_per_node_and_follow_a_moved_slot(
        redis_cluster: LocalCluster) -> None:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    b = open_backend(redis_cluster.url(prefix, query=f"&partitions={N}"))
    assert isinstance(b, PartitionedRedis)
    queues = one_per_partition(N)
    try:
        wait = Wait(b, queues, timeout=60)
        settle(b, N)
        slots = [redis_cluster.slot_of(f"{prefix}#{p}") for p in range(N)]
        owners = {redis_cluster.owner(s).port for s in slots}
        assert b._hub.connections() == len(owners)  # not one per partition

        p = 2
        src = redis_cluster.owner(slots[p])
        dst = redis_cluster.other_master(src)
        redis_cluster.migrate_slot(slots[p], dst)
        # The old node dropped the channel: the wait subscribed again at the new owner.
        deadline = time.monotonic() + 10
        while ((dst.port, ) != tuple(b.parts[p]._transport.route.address[1:])  # type: ignore[union-attr]
               or b._hub.subscriptions() < N):
            assert time.monotonic() < deadline, "never subscribed at the slot's new owner"
            time.sleep(0.02)
        assert wait.result is None  # still waiting
        b.enqueue_many([new_job(queue=queues[p])])
        assert wait.join() is True
        assert wait.took < 30
    finally:
        b.close()
        for p in range(N):
            redis_cluster.delete_prefix(f"{prefix}#{p}")
