"""The enqueue script takes a batch as runs of jobs that share every field but their args
(enqueue._runs, enqueue.lua): what it writes for a batch is what it writes for the same jobs
one call each, compared store against store, and a job that only looks like the one before it
(equal fields, not the same objects) is checked on its own. Runs on a private redis-server."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from redisrig import RedisServer
from test_enqueue_one import dump, store

from conveyor.backends.base import NewBatch, NewJob
from conveyor.backends.redis import enqueue as redis_enqueue
from conveyor.errors import StoreError

NOW = 1_000_000.25


def uids_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Job n of a store (counted over its calls) gets uid n, so two stores compare whole."""
    counter = itertools.count()
    monkeypatch.setattr(redis_enqueue, "new_uid_text",
                        lambda k: "".join(f"{next(counter):032x}" for _ in range(k)))


def kinds() -> list[list[NewJob]]:
    """Runs of jobs made as task.py makes them (one dict of shared values per run, so the
    fields are the same objects), of every kind the script writes apart."""

    def run(n: int, start: int, **shared: Any) -> list[NewJob]:
        base = {"task": "t", "queue": "default", "max_attempts": 3, "timeout": 30.0, **shared}
        return [NewJob(**base, args=json.dumps([start + i])) for i in range(n)]

    plain = {"task": "t", "queue": "default", "max_attempts": 3, "timeout": 30.0}
    return [
        run(3, 0, **plain),
        run(2, 10, priority=5, fair_key="tenant-a"),
        run(1, 20, fair_key="tenant-b"),
        run(2, 30, delay=100.0),
        run(2, 40, unique_key="u"),  # the second is held by the first
        run(2, 50, concurrency_key="c", concurrency_limit=2),
        run(1, 60, queue="other", max_depth=100),
        run(2, 70, after=(1,)),  # waiting on job 1
        run(1, 80, after=(2,)),  # job 2 is cancelled: cancelled at once
        run(2, 90, batch_id="b1"),
        run(2, 100, **plain),  # the first run's fields again, after others
    ]


@pytest.mark.parametrize("outbox", [False, True], ids=["plain", "outbox"])
def test_a_batch_writes_what_its_jobs_one_call_each_write(private_redis: RedisServer,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          outbox: bool) -> None:
    batch, single = store(private_redis, "inruns"), store(private_redis, "bycall")
    # The general script for every call, as a batch of one plain job would not take it.
    monkeypatch.setattr(redis_enqueue, "_plain", lambda job: False)
    try:
        for b in (batch, single):
            uids_counted(monkeypatch)
            parents = [NewJob(task="p", queue="default", args="[]", max_attempts=1, timeout=1.0)
                       for _ in range(2)]
            assert [r.id for r in b.enqueue_many(parents, now=NOW - 1)] == [1, 2]
            assert b.cancel(2, now=NOW - 0.5)
            b.outbox = outbox
            runs = kinds()
            jobs = [job for run in runs for job in run]
            if b is batch:
                got_batch = b.enqueue_many(jobs, now=NOW, batches=[NewBatch("b1")])
            else:
                got_single = []
                for n, job in enumerate(jobs):
                    first_of_batch = n == 0 or job.batch_id != jobs[n - 1].batch_id
                    made = [NewBatch("b1")] if job.batch_id and first_of_batch else []
                    got_single += b.enqueue_many([job], now=NOW, batches=made)
        assert got_batch == got_single
        assert [r.created for r in got_batch].count(False) == 1  # the held unique key
        r = private_redis.client()
        assert dump(r, "inruns") == dump(r, "bycall")
        for result in got_batch:
            a, b_ = batch.get(result.id), single.get(result.id)
            assert a is not None and a == b_
    finally:
        batch.close()
        single.close()


def test_a_job_equal_to_the_one_before_but_not_the_same_is_checked(
        private_redis: RedisServer) -> None:
    """1 == True and 3 == 3.0: a run is jobs whose fields are the same objects, so a job whose
    fields only compare equal to the run's is checked on its own, and refused."""
    b = store(private_redis, "equal")
    try:
        shared: dict[str, Any] = {"task": "t", "queue": "default", "max_attempts": 3,
                                  "timeout": 30.0, "priority": 1}
        good = [NewJob(**shared, args="[0]"), NewJob(**shared, args="[1]")]
        for field, value in (("priority", True), ("max_attempts", 3.0)):
            bad = NewJob(**{**shared, field: value}, args="[2]")
            assert bad == NewJob(**shared, args="[2]")  # equal, so no run can tell by ==
            with pytest.raises(StoreError, match=rf"job 2 of the batch.*{field}"):
                b.enqueue_many([*good, bad])
        with pytest.raises(StoreError, match=r"job 1 of the batch.*args must be JSON text"):
            b.enqueue_many([good[0], NewJob(**shared, args=[1])])  # type: ignore[arg-type]
        assert list(private_redis.client().scan_iter(match="{equal}*")) == []
    finally:
        b.close()
