"""Dependencies and batches in Redis, where the conformance file does not reach: what an ordinary
ack's script touches (MONITOR), a write with references longer than a chunk, and a store
written before dependencies existed. Runs on a private redis-server."""

from __future__ import annotations

import json
import threading
from typing import Any

from redisrig import RedisServer

from conveyor.backends.base import Lease, NewJob
from conveyor.backends.redis import ENQUEUE_CHUNK, RedisBackend
from conveyor.job import JobState

T0 = 1_700_000_000.0
DEPENDENCY_KEYS = (":kids:", ":batch:", ":members:", ":state:waiting", ":waiting")


def job(n: int = 0, **kw: Any) -> NewJob:
    return NewJob(task="t", queue="default", args=json.dumps([n]), max_attempts=3, timeout=30.0,
                  **kw)


def claim_one(backend: RedisBackend, job_id: int) -> Lease:
    [claimed] = backend.claim("default", 1, worker_id="w", lease_s=30.0, now=T0)
    assert claimed.id == job_id
    return Lease(claimed.id, claimed.lease_token or "")


def monitored(server: RedisServer, action: Any) -> list[list[str]]:
    """The commands Redis ran (scripts' own included) while ``action`` ran, as word lists."""
    r = server.client()
    seen: list[list[str]] = []
    ready = threading.Event()
    marker = "conveyor-test-end-of-action"

    def watch() -> None:
        with r.monitor() as m:
            ready.set()
            for event in m.listen():
                words = str(event["command"]).split()
                if marker in event["command"]:
                    return
                seen.append(words)

    t = threading.Thread(target=watch)
    t.start()
    ready.wait(5)
    r.ping()  # the monitor connection is set up before the action's first command
    action()
    r.echo(marker)
    t.join(10)
    assert not t.is_alive()
    return seen


def test_an_ack_of_a_job_without_children_reads_one_more_field_and_no_dependency_key(
        backend: RedisBackend, private_redis: RedisServer) -> None:
    plain = backend.enqueue_many([job(1)], now=T0)[0].id
    lease = claim_one(backend, plain)
    commands = monitored(private_redis, lambda: backend.ack(lease, "1", now=T0 + 1))
    assert any(c[0].upper() == "HMGET" and "kids" in c for c in commands)
    # (The script's call names the whole KEYS header, which holds the prefix keys: what counts
    # is what the script runs.)
    run = [c for c in commands if c[0].upper() not in ("EVALSHA", "EVAL", "SCRIPT")]
    assert len(run) > 5
    assert [c for c in run if any(k in w for w in c for k in DEPENDENCY_KEYS)] == []

    # The same ack of a parent does touch them: the check above can see them.
    parent = backend.enqueue_many([job(2)], now=T0)[0].id
    child = backend.enqueue_many([job(3, after=(parent,))], now=T0)[0].id
    lease = claim_one(backend, parent)
    commands = monitored(private_redis, lambda: backend.ack(lease, "2", now=T0 + 1))
    assert any(any(":kids:" in w for w in c) for c in commands)
    assert backend.get(child).state is JobState.AVAILABLE  # type: ignore[union-attr]


def test_a_chain_longer_than_a_chunk_is_one_script(backend: RedisBackend) -> None:
    calls: list[str] = []
    run = backend._run

    def spy(name: str, queues: Any, args: Any, **kw: Any) -> Any:
        calls.append(name)
        return run(name, queues, args, **kw)

    backend._run = spy  # type: ignore[method-assign]
    total = ENQUEUE_CHUNK + 200
    res = backend.enqueue_many(
        [job(0)] + [job(n, after_refs=(n - 1,)) for n in range(1, total)], now=T0)
    assert calls == ["enqueue"]
    ids = [r.id for r in res]
    assert backend.get(ids[-1]).parents == (ids[-2],)  # type: ignore[union-attr]
    assert backend.stats(now=T0).queues[0].waiting == total - 1


def test_a_store_written_before_dependencies_still_reads(backend: RedisBackend,
                                                         private_redis: RedisServer) -> None:
    """A job hash and indexes as the previous version wrote them (written here by hand): no
    waiting indexes, no 'kids' field. It reads, counts, claims and acks, and can be a parent."""
    r = private_redis.client()
    p = "{" + backend.prefix + "}"
    member = backend.enqueue_many([job(9)], now=T0)  # a plain job: the old layout exactly
    old = member[0].id
    assert not [k for k in r.scan_iter(match=f"{p}*")
                if any(d in k for d in DEPENDENCY_KEYS)]
    got = backend.get(old)
    assert got is not None and got.parents == () and got.batch_id is None
    assert got.on_parent_failure == "cancel" and got.callback_of is None
    [q] = backend.stats(now=T0).queues
    assert (q.waiting, q.available) == (0, 1)
    assert backend.list_jobs(state=JobState.WAITING).jobs == []
    child = backend.enqueue_many([job(10, after=(old,))], now=T0)[0].id
    assert backend.get(child).state is JobState.WAITING  # type: ignore[union-attr]
    backend.ack(claim_one(backend, old), None, now=T0 + 1)
    assert backend.get(child).state is JobState.AVAILABLE  # type: ignore[union-attr]
