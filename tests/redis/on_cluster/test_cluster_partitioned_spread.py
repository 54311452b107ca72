"""One app of six partitions on the local cluster: its partitions are served by several
masters, and a worker on queues of every partition runs them all (each partition's scripts
on its own node)."""

from __future__ import annotations

from pathlib import Path

from clusterrig import LocalCluster
from partitioned import store_url  # noqa: F401 - the fixture these tests run on
from support import running_worker, wait_for_job

from conveyor import Conveyor, JobState
from conveyor.backends.base import NewJob
from conveyor.backends.redis.partitions import queue_partition
from conveyor.testing import temporary_store


def test_the_partitions_are_served_by_several_masters_and_all_run(
        store_url: str, redis_cluster: LocalCluster) -> None:  # noqa: F811
    app = Conveyor(store_url)
    backend = app.backend
    n = backend.n  # type: ignore[attr-defined]
    prefix = backend.prefix  # type: ignore[attr-defined]
    owners = {redis_cluster.owner(redis_cluster.slot_of(f"{prefix}#{p}")).addr for p in range(n)}
    assert len(owners) >= 2, owners  # six slots on three masters: spread, not one shard
    queues: dict[int, str] = {}
    i = 0
    while len(queues) < n:
        queues.setdefault(queue_partition(f"q{i}", n), f"q{i}")
        i += 1

    @app.task(name="echo")
    def echo(x: int) -> int:
        return x

    try:
        jobs = [echo.options(queue=q).enqueue(k) for k in range(5) for q in queues.values()]
        with running_worker(app, queues=list(queues.values()), concurrency=4):
            for job in jobs:
                assert wait_for_job(app, job.id, timeout=30).state is JobState.SUCCEEDED
        for q in queues.values():
            assert [s.succeeded for s in app.backend.stats().queues if s.queue == q] == [5], q
    finally:
        app.close()


def test_queues_of_one_tag_share_a_partition_and_run_a_workflow_on_the_cluster(
        store_url: str, redis_cluster: LocalCluster) -> None:  # noqa: F811
    """Braces in queue names, through the app, on real shards: ``emails{acme}`` and
    ``reports{acme}`` share a partition (so a master), so a job in one may wait for a job in
    the other; both run from one worker."""
    app = Conveyor(store_url)
    n = app.backend.n  # type: ignore[attr-defined]
    assert queue_partition("emails{acme}", n) == queue_partition("reports{acme}", n)

    @app.task(name="step")
    def step(x: str) -> str:
        return x

    try:
        first = step.options(queue="emails{acme}").enqueue("fetched")
        then = step.options(queue="reports{acme}", after=[first]).enqueue("reported")
        with running_worker(app, queues=["emails{acme}", "reports{acme}"], concurrency=2):
            done = wait_for_job(app, then.id, timeout=30)
        assert done.state is JobState.SUCCEEDED and done.result == "reported"
        assert app.get_job(first.id).state is JobState.SUCCEEDED
    finally:
        app.close()


def test_a_temporary_partitioned_store_leaves_no_key_on_any_master(
        redis_cluster: LocalCluster, tmp_path: Path) -> None:
    base = redis_cluster.url("ignored").split("?")[0] + "?partitions=6"
    with temporary_store(base, tmp_path) as url:
        app = Conveyor(url)
        try:
            for i in range(12):
                app.backend.enqueue_many([NewJob(task="t", queue=f"q{i}", args="{}",
                                                 max_attempts=1, timeout=5)])
            prefix = app.backend.prefix  # type: ignore[attr-defined]
        finally:
            app.close()
        assert sum(len(keys_of(redis_cluster, prefix, p)) for p in range(6)) > 12
    assert sum(len(keys_of(redis_cluster, prefix, p)) for p in range(6)) == 0


def keys_of(cluster: LocalCluster, prefix: str, p: int) -> list[bytes]:
    tag = f"{prefix}#{p}"
    client = cluster.owner(cluster.slot_of(tag)).client()
    try:
        return list(client.scan_iter(match="{" + tag + "}*", count=1000))
    finally:
        client.close()
