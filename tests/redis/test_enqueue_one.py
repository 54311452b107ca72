"""enqueue_one.lua, the short script for a single plain job (RedisBackend._enqueue_one), writes
exactly what the general enqueue script writes for that job: every key, field, score and
member, compared store against store. Runs on a private redis-server."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
import redis
from redisrig import RedisServer

from conveyor.backends import open_backend
from conveyor.backends.base import NewJob
from conveyor.backends.redis import RedisBackend
from conveyor.backends.redis import enqueue as redis_enqueue
from conveyor.errors import StoreError
from conveyor.job import JobState


def plain(i: int, **kw: Any) -> NewJob:
    fields: dict[str, Any] = {"task": "t", "queue": "default", "args": json.dumps([i]), "max_attempts": 3,
                              "timeout": 30.0}
    fields.update(kw)
    return NewJob(**fields)


# Plain jobs of several kinds: priorities (each a fair round of its own, one of them raised by a
# claim in between), a negative delay (due now), a meta document, another queue.
BATCHES = [
    plain(0),
    plain(1, priority=5),
    plain(2, priority=7, delay=-10.0),
    plain(3, meta=json.dumps({"trace": {"traceparent": "00-abc-def-01"}})),
    plain(4, queue="other", max_attempts=1, timeout=2.5),
    plain(5),
]


def dump(r: redis.Redis, prefix: str) -> dict[str, Any]:
    """Every key of the app with its whole value, the prefix taken out of names and values."""
    out: dict[str, Any] = {}
    for key in r.scan_iter(match=f"{{{prefix}}}*"):
        kind = r.type(key)
        value: Any
        if kind == "hash":
            value = r.hgetall(key)
            if "lease_token" in value:  # random per claim
                value["lease_token"] = "T"
        elif kind == "zset":
            value = r.zrange(key, 0, -1, withscores=True)
        elif kind == "set":
            value = sorted(r.smembers(key))  # type: ignore[arg-type]
        elif kind == "list":
            value = r.lrange(key, 0, -1)
        else:
            value = r.get(key)
        out[key.replace(prefix, "P")] = json.loads(json.dumps(value).replace(prefix, "P"))
    return out


def store(server: RedisServer, prefix: str) -> RedisBackend:
    b = open_backend(f"redis://127.0.0.1:{server.port}/0?prefix={prefix}")
    assert isinstance(b, RedisBackend)
    return b


def test_the_short_script_writes_what_the_general_one_writes(private_redis: RedisServer,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    short, general = store(private_redis, "short"), store(private_redis, "general")
    sent: list[str] = []
    real_script = RedisBackend._script

    def recorded(self: RedisBackend, name: str, keys: Any, args: Any) -> Any:
        sent.append(f"{'short' if self is short else 'general'}:{name}")
        return real_script(self, name, keys, args)

    monkeypatch.setattr(RedisBackend, "_script", recorded)
    try:
        for n, job in enumerate(BATCHES):
            now = 1_000_000.25 + n
            if n == 3:  # a claim raises priority 0's virtual time: later tags start above it
                for b in (short, general):
                    [claimed] = b.claim("default", 1, worker_id="w", lease_s=30, now=now - 0.5)
                    assert claimed.id == 1
            # The same random uid for both stores' n-th job, so the stores can be compared.
            monkeypatch.setattr(redis_enqueue, "new_uids", lambda k, n=n: [f"{n:032x}"] * k)
            monkeypatch.setattr(redis_enqueue, "new_uid_text", lambda k, n=n: f"{n:032x}" * k)
            got_short = short.enqueue_many([job], now=now)
            with monkeypatch.context() as m:
                m.setattr(redis_enqueue, "_plain", lambda job: False)
                got_general = general.enqueue_many([job], now=now)
            assert got_short == got_general
        r = private_redis.client()
        # The short script left its jobs' index entries in the inboxes: the next script given
        # the queue (stats here, for every queue) folds them in, and then the stores are equal.
        before = dump(r, "short")
        assert before["{P}:q:default:inbox"] and before["{P}:q:other:inbox"]
        assert "{P}:q:default:inbox" not in dump(r, "general")
        short.stats()
        general.stats()
        assert dump(r, "short") == dump(r, "general")
        assert {s.split(":")[1] for s in sent if s.startswith("short:")} >= {"enqueue_one"}
        assert "short:enqueue" not in sent and "general:enqueue_one" not in sent
        # What a reader gets back is the same too.
        for job_id in range(1, len(BATCHES) + 1):
            a, b = short.get(job_id), general.get(job_id)
            assert a is not None and b is not None
            assert {**vars(a), "lease_token": None} == {**vars(b), "lease_token": None}
    finally:
        short.close()
        general.close()


def test_a_bad_plain_job_is_refused_and_nothing_is_written(private_redis: RedisServer) -> None:
    b = store(private_redis, "bad")
    try:
        for job in (plain(0, max_attempts=0), plain(0, timeout=float("nan")), plain(0, delay=float("-inf")),
                    plain(0, queue="")):
            with pytest.raises(StoreError):
                b.enqueue_many([job])
        assert list(private_redis.client().scan_iter(match="{bad}*")) == []
    finally:
        b.close()


def test_jobs_with_options_take_the_general_script(private_redis: RedisServer,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    b = store(private_redis, "opts")
    sent: list[str] = []
    real_script = RedisBackend._script

    def recorded(self: RedisBackend, name: str, keys: Any, args: Any) -> Any:
        sent.append(name)
        return real_script(self, name, keys, args)

    monkeypatch.setattr(RedisBackend, "_script", recorded)
    try:
        for job in (plain(0, unique_key="u"), plain(0, max_depth=10), plain(0, fair_key="f"),
                    plain(0, concurrency_key="c", concurrency_limit=1), plain(0, rate_key="r", rate_limit=1,
                                                                             rate_period=1.0),
                    plain(0, delay=5.0), plain(0, run_at=1.0), plain(0, unique_key="v", unique_for=3.0)):
            sent.clear()
            b.enqueue_many([job])
            assert sent == ["enqueue"], job
        sent.clear()
        b.enqueue_many([plain(1), plain(2)])  # a batch, even of plain jobs
        assert sent == ["enqueue"]
    finally:
        b.close()


def inbox_len(b: RedisBackend, queue: str = "default") -> int:
    return int(b._transport.r.llen(b.keys.queue(queue, "inbox")))


def test_enqueue_one_folds_its_inbox_when_it_is_full(private_redis: RedisServer) -> None:
    b = store(private_redis, "full")
    try:
        fold_at = 256  # FOLD_AT in _core.lua
        ids = [r.id for job in [plain(i) for i in range(fold_at + 1)] for r in b.enqueue_many([job])]
        # The 256th enqueue folded all 256; the 257th waits in the inbox alone.
        assert inbox_len(b) == 1
        r = private_redis.client()
        indexed = [int(i) for i in r.zrange(b.keys.queue("default", "jobs"), 0, -1)]
        assert indexed == ids[:fold_at]
        assert r.zcard(b.keys.queue("default", "available")) == fold_at
        assert r.zcard(b.keys.queue("default", "due")) == fold_at
        assert r.zcard(b.keys.state("available")) == fold_at
        assert r.zcard(b.keys.all_jobs) == fold_at
    finally:
        b.close()


# Each reader and writer of a queue, met with jobs that are still in the inbox: (what it does,
# what it must see).
def _list_all(b: RedisBackend) -> None:
    assert [j.id for j in b.list_jobs().jobs] == [3, 2, 1]


def _list_queue(b: RedisBackend) -> None:
    assert [j.id for j in b.list_jobs(queue="default", state=JobState.AVAILABLE).jobs] == [3, 2, 1]


def _list_state(b: RedisBackend) -> None:
    assert [j.id for j in b.list_jobs(state=JobState.AVAILABLE).jobs] == [3, 2, 1]


def _stats(b: RedisBackend) -> None:
    [q] = b.stats(now=1_000_010.0).queues
    assert (q.queue, q.available, q.oldest_available_age) == ("default", 3, 10.0)


def _claim(b: RedisBackend) -> None:
    # Priority first: job 2 was enqueued with priority -1.
    assert [j.id for j in b.claim("default", 3, worker_id="w", lease_s=30)] == [2, 1, 3]


def _cancel(b: RedisBackend) -> None:
    assert b.cancel(2)
    assert [j.id for j in b.claim("default", 3, worker_id="w", lease_s=30)] == [1, 3]


def _purge(b: RedisBackend) -> None:
    # Only finished jobs are purged: the waiting ones stay, indexed.
    assert b.purge(state=JobState.DEAD) == 0
    assert [j.id for j in b.list_jobs(queue="default").jobs] == [3, 2, 1]


def _general_enqueue(b: RedisBackend) -> None:
    # A job with options goes the general way: the inbox is folded before it, so the order
    # within the round holds (its fair key starts a round at the same virtual time).
    [res] = b.enqueue_many([plain(9, fair_key="k")])
    assert [j.id for j in b.claim("default", 4, worker_id="w", lease_s=30)] == [2, 1, 3, res.id]


@pytest.mark.parametrize("use", [_list_all, _list_queue, _list_state, _stats, _claim, _cancel, _purge,
                                 _general_enqueue], ids=lambda f: f.__name__.strip("_"))
def test_every_script_given_the_queue_sees_the_inbox(private_redis: RedisServer, use: Any) -> None:
    b = store(private_redis, f"sees{use.__name__}")
    try:
        for n, job in enumerate([plain(1), plain(2, priority=-1), plain(3)]):
            b.enqueue_many([job], now=1_000_000.0 + n)
        assert inbox_len(b) == 3
        assert private_redis.client().zcard(b.keys.queue("default", "available")) == 0
        use(b)
        assert inbox_len(b) == 0
    finally:
        b.close()


def test_an_idle_workers_look_counts_the_inbox_and_leaves_it_to_the_claim(
        private_redis: RedisServer) -> None:
    """look.lua reads four keys a queue and folds nothing (cheap on thousands of queues): an
    inbox's entries are jobs waiting, so the look says so, and the claim it leads to folds."""
    b = store(private_redis, "look")
    try:
        for n, job in enumerate([plain(1), plain(2, priority=-1), plain(3)]):
            b.enqueue_many([job], now=1_000_000.0 + n)
        assert b._peek(["default", "other"]) == (True, None)
        assert b.ready_queues(["other", "default"]) == ["default"]
        assert inbox_len(b) == 3  # not folded by the look
        assert [j.id for j in b.claim("default", 3, worker_id="w", lease_s=30)] == [2, 1, 3]
        assert inbox_len(b) == 0
        assert b._peek(["default"]) == (False, None) and b.ready_queues(["default"]) == []
    finally:
        b.close()


def test_the_first_jobs_after_a_fold_wake_idle_workers(private_redis: RedisServer) -> None:
    b = store(private_redis, "wake")
    r = private_redis.client()
    wake = b.keys.queue("default", "wake")
    try:
        for i in range(20):
            b.enqueue_many([plain(i)])
        # One marker for each of the first 8 jobs in the inbox, none after (the list keeps 8).
        assert inbox_len(b) == 20 and r.llen(wake) == 8
        assert len(b.claim("default", 20, worker_id="w", lease_s=30)) == 20  # folds, takes all
        r.delete(wake)
        # A worker waiting now looked first (a fold): the next job is the inbox's first again,
        # and its marker wakes the worker.
        woke: list[bool] = []
        waiter = threading.Thread(target=lambda: woke.append(b.wait_for_jobs(["default"], timeout=10.0)))
        waiter.start()
        time.sleep(0.3)
        assert waiter.is_alive()
        b.enqueue_many([plain(99)])
        waiter.join(timeout=5.0)
        assert woke == [True]
        assert [j.args for j in b.claim("default", 5, worker_id="w", lease_s=30)] == [[99]]
    finally:
        b.close()
