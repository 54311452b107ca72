"""enqueue_one.lua, the short script for a single plain job (RedisBackend._enqueue_one), writes
exactly what the general enqueue script writes for that job: every key, field, score and
member, compared store against store. Runs on a private redis-server."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from redisrig import RedisServer

from conveyor.backends import open_backend
from conveyor.backends import redis as redis_backend
from conveyor.backends.base import NewJob
from conveyor.backends.redis import RedisBackend
from conveyor.errors import StoreError


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
            got_short = short.enqueue_many([job], now=now)
            with monkeypatch.context() as m:
                m.setattr(redis_backend, "_plain", lambda job: False)
                got_general = general.enqueue_many([job], now=now)
            assert got_short == got_general
        r = private_redis.client()
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
