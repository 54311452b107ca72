"""A worker says so at start when its Redis can lose acknowledged jobs, and is quiet when it can't."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from redisrig import RedisServer
from support import running_worker

from conveyor import Conveyor


def _warnings_at_start(url: str, caplog: pytest.LogCaptureFixture) -> list[str]:
    app = Conveyor(url)
    caplog.set_level(logging.WARNING, logger="conveyor.worker")
    try:
        with running_worker(app, concurrency=1) as wt:
            assert wt.worker.id  # the worker ran its start-up before being stopped
    finally:
        app.close()
    return [r.getMessage() for r in caplog.records if r.name == "conveyor.worker" and r.levelno == logging.WARNING]


def test_worker_warns_about_redis_without_persistence(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    server = RedisServer(tmp_path, appendonly=False).start()
    try:
        messages = _warnings_at_start(server.url, caplog)
    finally:
        server.stop()
    assert any("no persistence" in m and "appendonly yes" in m for m in messages), messages


def test_worker_is_quiet_about_redis_with_aof(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    server = RedisServer(tmp_path).start()  # appendonly yes, appendfsync everysec
    try:
        messages = _warnings_at_start(server.url, caplog)
    finally:
        server.stop()
    assert not [m for m in messages if "persistence" in m or "appendfsync" in m], messages


def test_start_up_reads_survive_a_broken_connection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection that breaks while the worker reads the server's config at start (a killed
    client, a failover) is retried as every safe read is, instead of ending the worker."""
    import redis

    from conveyor.backends.redis import RedisBackend

    server = RedisServer(tmp_path, appendonly=False).start()
    backend = RedisBackend(server.url)
    real = backend._transport.r.config_get
    broken = {"n": 0}

    def config_get(*args: object, **kw: object) -> object:
        if not broken["n"]:
            broken["n"] += 1
            raise redis.ConnectionError("Connection closed by server.")
        return real(*args, **kw)

    monkeypatch.setattr(backend._transport.r, "config_get", config_get)
    try:
        messages = backend.startup_warnings()
    finally:
        backend.close()
        server.stop()
    assert broken["n"] == 1
    assert any("no persistence" in m for m in messages), messages
