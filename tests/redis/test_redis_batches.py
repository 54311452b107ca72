"""enqueue_many of a batch bigger than one script should hold: written in chunks, so Redis
(single-threaded: every other client waits while a script runs) is never blocked for long.

Each test runs on a private redis-server (see conftest.py), never the shared one."""

from __future__ import annotations

from typing import Any

import pytest
from redisrig import RedisServer

from conveyor import QueueFull, StoreError
from conveyor.backends.base import NewJob
from conveyor.backends.redis import ENQUEUE_CHUNK, RedisBackend

T0 = 1_700_000_000.0


def job(n: int = 0, **kw: Any) -> NewJob:
    return NewJob(task="t", queue="default", args=f'{{"n": {n}}}', max_attempts=3, timeout=30.0, **kw)


@pytest.fixture
def enqueue_calls(backend: RedisBackend, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of jobs each enqueue script call carried (26 arguments per job after 4 and
    the batches' pairs: see enqueue.lua)."""
    calls: list[int] = []
    run = backend._run

    def spy(name: str, queues: Any, args: Any, **kw: Any) -> Any:
        if name == "enqueue":
            calls.append((len(args) - 4 - 2 * int(args[3])) // 26)
        return run(name, queues, args, **kw)

    monkeypatch.setattr(backend, "_run", spy)
    return calls


def test_a_big_batch_goes_in_chunks_in_order(backend: RedisBackend, enqueue_calls: list[int]) -> None:
    total = 2 * ENQUEUE_CHUNK + 345
    results = backend.enqueue_many([job(n, unique_key=f"u{n % (total - 5)}") for n in range(total)], now=T0)
    assert enqueue_calls == [ENQUEUE_CHUNK, ENQUEUE_CHUNK, 345]
    assert len(results) == total
    made = [r for r in results if r.created]
    assert [r.id for r in made] == sorted(r.id for r in made) and len(made) == total - 5
    # A unique key repeated across a chunk boundary is found as within one script: the last 5
    # jobs repeat the first 5 keys and get their ids back.
    assert [(r.id, r.created) for r in results[-5:]] == [(r.id, False) for r in results[:5]]
    [q] = backend.stats(now=T0).queues
    assert q.available == total - 5
    page = backend.list_jobs(limit=1)
    assert page.jobs[0].args == {"n": total - 6}  # the newest job is the batch's last one made


def test_a_batch_with_a_bad_job_past_the_first_chunk_writes_nothing(
        backend: RedisBackend, enqueue_calls: list[int], private_redis: RedisServer) -> None:
    jobs = [job(n) for n in range(ENQUEUE_CHUNK + 10)]
    jobs[ENQUEUE_CHUNK + 5] = NewJob(task="t", queue="default", args="{}", max_attempts=0, timeout=30.0)
    with pytest.raises(StoreError, match=f"job {ENQUEUE_CHUNK + 5} of the batch"):
        backend.enqueue_many(jobs, now=T0)
    assert enqueue_calls == []
    c = private_redis.client()
    assert c.dbsize() == 0
    c.close()


def test_a_later_chunk_refused_says_what_was_written(backend: RedisBackend) -> None:
    limit = ENQUEUE_CHUNK + ENQUEUE_CHUNK // 2
    with pytest.raises(QueueFull) as info:
        backend.enqueue_many([job(n, max_depth=limit) for n in range(2 * ENQUEUE_CHUNK)], now=T0)
    text = str(info.value)
    assert f"nothing was enqueued (said of jobs {ENQUEUE_CHUNK}-{2 * ENQUEUE_CHUNK - 1} of a batch" in text
    assert f"the first {ENQUEUE_CHUNK} jobs of the batch were enqueued before it" in text
    assert info.value.limit == limit
    [q] = backend.stats(now=T0).queues
    assert q.available == ENQUEUE_CHUNK
