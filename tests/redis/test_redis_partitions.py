"""One app over several partitions (backends/redis/partitions.py), on the machine's Redis: where
each queue's jobs and each id go, what the router refuses, and the reads it merges. The whole
conformance suite runs on such an app too (``redis-partitioned`` in tests/stores.py), and on a
real cluster's shards in tests/redis/on_cluster/test_cluster_partitioned.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from stores import REDIS_URL, BackendUnavailable, redis_store
from support import T0, enqueue_one, new_job, running_worker, wait_for_job

from conveyor import Conveyor
from conveyor.backends import open_backend
from conveyor.backends.base import Lease, NewBatch
from conveyor.backends.redis import RedisBackend
from conveyor.backends.redis.keys import ID_STRIDE
from conveyor.backends.redis.partitions import (
    PartitionedRedis,
    id_partition,
    partitions_of,
    queue_partition,
)
from conveyor.errors import ConfigurationError, UnknownParent
from conveyor.job import JobState
from conveyor.testing import temporary_store

N = 4


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    try:
        with redis_store(tmp_path, partitions=N) as u:
            yield u
    except BackendUnavailable as exc:
        pytest.skip(str(exc))  # the conformance run says so for CI; these need the server too


@pytest.fixture
def backend(url: str) -> Iterator[PartitionedRedis]:
    b = open_backend(url)
    assert isinstance(b, PartitionedRedis)
    try:
        yield b
    finally:
        b.close()


def queues_in(n: int, *, distinct: bool) -> list[str]:
    """``n`` queue names, each in a partition of its own (distinct) or all in one."""
    out: list[str] = []
    seen: set[int] = set()
    i = 0
    while len(out) < n:
        q = f"q{i}"
        p = queue_partition(q, N)
        if (p not in seen) if distinct else (not out or p == queue_partition(out[0], N)):
            out.append(q)
            seen.add(p)
        i += 1
    return out


def test_the_url_option() -> None:
    assert partitions_of("redis://h/0?prefix=a&partitions=8") == (8, "redis://h/0?prefix=a")
    assert partitions_of("redis://h/0?prefix=a") == (1, "redis://h/0?prefix=a")
    for bad in ("0", "x", "1025"):
        with pytest.raises(ConfigurationError):
            partitions_of(f"redis://h/0?partitions={bad}")
    one = open_backend(f"{REDIS_URL}?prefix=plain_one&partitions=1")
    assert isinstance(one, RedisBackend)  # one partition is a plain app
    one.close()


def test_each_queue_lives_in_its_partition_and_each_id_names_it(backend: PartitionedRedis) -> None:
    queues = queues_in(N, distinct=True)
    ids = {q: enqueue_one(backend, now=T0, queue=q) for q in queues}
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        for q, job_id in ids.items():
            p = queue_partition(q, N)
            assert id_partition(job_id) == p and job_id >= ID_STRIDE
            assert client.exists(f"{{{backend.prefix}#{p}}}:job:{job_id}")
            assert backend.get(job_id).queue == q  # type: ignore[union-attr]
            [job] = backend.claim(q, 5, worker_id="w", lease_s=30, now=T0)
            assert job.id == job_id
    finally:
        client.close()
    assert {s.queue for s in backend.stats().queues} == set(queues)


def test_queues_with_a_common_tag_share_a_partition_and_may_link(
        backend: PartitionedRedis) -> None:
    parts = {queue_partition(f"{name}{{acme}}", N) for name in ("emails", "reports", "x", "y")}
    assert len(parts) == 1
    parent = enqueue_one(backend, now=T0, queue="emails{acme}")
    child = enqueue_one(backend, now=T0, queue="reports{acme}", after=(parent,))
    assert backend.get(child).state is JobState.WAITING  # type: ignore[union-attr]
    [job] = backend.claim("emails{acme}", 5, worker_id="w", lease_s=30, now=T0)
    assert job.id == parent and job.lease_token is not None
    backend.ack(Lease(job.id, job.lease_token), None, now=T0)
    assert backend.get(child).state is JobState.AVAILABLE  # type: ignore[union-attr]
    res = backend.enqueue_many(
        [new_job(queue="emails{acme}", batch_id="b1"), new_job(queue="x{acme}", batch_id="b1")],
        now=T0, batches=[NewBatch("b1")])
    info = backend.get_batch("b1")
    assert info is not None and info.total == 2 and len(res) == 2


def test_an_app_puts_queues_of_one_tag_together_and_links_them(url: str) -> None:
    """Through the app (its queue-name check allows braces): the tag chooses the partition, so
    a parent in one queue and its child in another run as a workflow; two untagged queues in
    different partitions may not be linked."""
    app = Conveyor(url)

    @app.task(name="fetch")
    def fetch() -> str:
        return "fetched"

    @app.task(name="report")
    def report() -> str:
        return "reported"

    untagged = ("emails", "invoices")
    assert queue_partition(untagged[0], N) != queue_partition(untagged[1], N)
    try:
        parent = fetch.options(queue="emails{acme}").enqueue()
        child = report.options(queue="reports{acme}", after=[parent]).enqueue()
        assert id_partition(parent.id) == id_partition(child.id) == queue_partition("{acme}", N)
        with running_worker(app, queues=["emails{acme}", "reports{acme}"], concurrency=2):
            done = wait_for_job(app, child.id, timeout=30)
        assert done.state is JobState.SUCCEEDED and done.result == "reported"
        apart = fetch.options(queue=untagged[0]).enqueue()
        with pytest.raises(ConfigurationError, match="partition"):
            report.options(queue=untagged[1], after=[apart]).enqueue()
        assert {s.queue for s in app.backend.stats().queues} == {
            "emails{acme}", "reports{acme}", "emails"}
    finally:
        app.close()


def test_links_across_partitions_are_refused_and_write_nothing(
        backend: PartitionedRedis) -> None:
    a, b = queues_in(2, distinct=True)
    parent = enqueue_one(backend, now=T0, queue=a)
    with pytest.raises(ConfigurationError, match="partition"):
        enqueue_one(backend, now=T0, queue=b, after=(parent,))
    with pytest.raises(ConfigurationError, match="one partition"):
        backend.enqueue_many([new_job(queue=a, batch_id="b"), new_job(queue=b, batch_id="b")],
                             now=T0, batches=[NewBatch("b")])
    with pytest.raises(UnknownParent):  # an id no partition holds is unknown, not "elsewhere"
        enqueue_one(backend, now=T0, queue=b, after=(parent + 1,))
    assert [s.queue for s in backend.stats().queues] == [a]


def test_a_write_over_several_partitions_keeps_each_jobs_place(backend: PartitionedRedis) -> None:
    queues = queues_in(N, distinct=True) * 3
    res = backend.enqueue_many([new_job(queue=q) for q in queues], now=T0)
    assert [backend.get(r.id).queue for r in res] == queues  # type: ignore[union-attr]
    assert all(id_partition(r.id) == queue_partition(q, N) for r, q in zip(res, queues, strict=True))


def test_unique_keys_are_per_partition(backend: PartitionedRedis) -> None:
    a, b = queues_in(2, distinct=True)
    a2 = queues_in(2, distinct=False)[1] if queue_partition("q0", N) == queue_partition(a, N) \
        else None
    first = backend.enqueue_many([new_job(queue=a, unique_key="k")], now=T0)[0]
    again = backend.enqueue_many([new_job(queue=a, unique_key="k")], now=T0)[0]
    assert again.id == first.id and not again.created
    other = backend.enqueue_many([new_job(queue=b, unique_key="k")], now=T0)[0]
    assert other.created and other.id != first.id  # another partition: its own keys
    if a2 is not None:
        same = backend.enqueue_many([new_job(queue=a2, unique_key="k")], now=T0)[0]
        assert same.id == first.id  # a queue of the same partition shares them


def test_listing_is_newest_first_across_partitions_page_by_page(
        backend: PartitionedRedis) -> None:
    queues = queues_in(N, distinct=True)
    ids = [r.id for r in backend.enqueue_many(
        [new_job(queue=queues[i % N]) for i in range(37)], now=T0)]
    seen: list[int] = []
    cursor = None
    while True:
        page = backend.list_jobs(cursor=cursor, limit=5)
        seen += [j.id for j in page.jobs]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == sorted(ids, reverse=True)


def test_the_number_of_partitions_is_fixed_at_first_use(url: str) -> None:
    first = open_backend(url)
    enqueue_one(first, now=T0)
    other = open_backend(url.replace(f"partitions={N}", "partitions=2"))
    try:
        with pytest.raises(ConfigurationError, match=f"partitions={N}"):
            enqueue_one(other, now=T0)
        for read in (other.stats, other.list_jobs):  # an admin's reads refuse it too
            with pytest.raises(ConfigurationError, match=f"partitions={N}"):
                read()
    finally:
        other.close()
        first.close()


def test_cron_takes_each_tick_once_in_its_queues_partition(backend: PartitionedRedis) -> None:
    q = queues_in(2, distinct=True)[1]
    assert backend.cron_enqueue("nightly", T0, None, now=T0) is None  # first sight: tick only
    assert backend.cron_ticks() == {"nightly": T0}
    made = backend.cron_enqueue("nightly", T0 + 60, new_job(queue=q), now=T0 + 60)
    assert made is not None and id_partition(made.id) == queue_partition(q, N)
    assert backend.cron_enqueue("nightly", T0 + 60, new_job(queue=q), now=T0 + 61) is None
    assert backend.cron_ticks() == {"nightly": T0 + 60}
    assert backend.set_cron_enabled("nightly", False, now=T0 + 62)
    assert backend.cron_enqueue("nightly", T0 + 120, new_job(queue=q), now=T0 + 120) is None
    state = backend.cron_states()["nightly"]
    assert state.disabled and state.last_job_id == made.id and state.last_tick == T0 + 120


def test_an_idle_worker_on_queues_of_several_partitions_is_woken_by_each(url: str) -> None:
    """The worker's poll is an hour: only a wake-up of the partition a job went to can start it
    (a thread waits on each partition)."""
    queues = queues_in(3, distinct=True)
    app = Conveyor(url)

    @app.task(name="note")
    def note(q: str) -> str:
        return q

    try:
        with running_worker(app, queues=queues, concurrency=2, poll_interval=3600):
            time.sleep(0.5)  # the worker is idle, waiting on every partition
            for q in queues:
                job = note.options(queue=q).enqueue(q)
                done = wait_for_job(app, job.id, timeout=30)
                assert done.state is JobState.SUCCEEDED and done.result == q
    finally:
        app.close()


def test_a_temporary_partitioned_store_leaves_no_key(tmp_path: Path) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        with temporary_store(f"{REDIS_URL}?partitions={N}", tmp_path) as url:
            b = open_backend(url)
            assert isinstance(b, PartitionedRedis)
            b.enqueue_many([new_job(queue=q) for q in queues_in(N, distinct=True)])
            b.close()
            pattern = "{" + b.prefix + "#*"
            assert len(list(client.scan_iter(match=pattern))) > N
        assert list(client.scan_iter(match=pattern)) == []
    finally:
        client.close()
