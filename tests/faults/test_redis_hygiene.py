"""S8: Redis connection hygiene. A Redis off this machine reached without TLS or a password is
named in the worker's startup warnings; over a whole life of jobs (enqueue, run, retry, dead,
redrive, purge, prune, stats) the library never sends FLUSHALL, FLUSHDB, KEYS, CONFIG SET or
SCRIPT FLUSH, and no Lua script calls them."""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from stores import BACKENDS, BackendUnavailable, _unavailable
from support import running_worker, wait_for_job

from conveyor import Conveyor, Reject
from conveyor.backends.redis import _exposure_warnings

FORBIDDEN = {"FLUSHALL", "FLUSHDB", "KEYS", "CONFIG SET", "SCRIPT FLUSH", "SCRIPT KILL", "DEBUG", "SHUTDOWN"}
LUA = Path(__file__).resolve().parents[2] / "src" / "conveyor" / "backends" / "redis" / "lua"


@pytest.mark.parametrize(("url", "risks"), [
    ("redis://127.0.0.1:6379/0", []),
    ("redis://localhost/0", []),
    ("redis://[::1]:6379", []),
    ("redis://cache.internal:6379/0", ["TLS", "password"]),
    ("redis://app:s3cret@cache.internal:6379/0", ["TLS"]),
    ("rediss://cache.internal:6380/0", ["password"]),
    ("rediss://app:s3cret@cache.internal:6380/0", []),
])
def test_remote_redis_without_tls_or_password_is_named(url: str, risks: list[str]) -> None:
    found = _exposure_warnings(url, "cache.internal")
    assert [r for r in ("TLS", "password") if any(r in w for w in found)] == risks
    assert all("s3cret" not in w for w in found)


def test_no_lua_script_calls_a_dangerous_command() -> None:
    scripts = list(LUA.glob("*.lua"))
    assert len(scripts) > 10
    call = re.compile(r"redis\.p?call\(\s*'([A-Za-z]+)'(?:\s*,\s*'([A-Za-z]+)')?")
    used = Counter()
    for path in scripts:
        for name, sub in call.findall(path.read_text()):
            used[f"{name.upper()} {sub.upper()}".strip() if name.upper() in ("CONFIG", "SCRIPT") else name.upper()] += 1
    assert used, "the pattern found no redis.call at all"
    assert not FORBIDDEN & set(used), sorted(FORBIDDEN & set(used))


def test_a_life_of_jobs_sends_no_dangerous_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The spy sits on the wire: every command redis-py or the backend packs itself (its
    scripts, its pipelines) leaves through Connection.send_packed_command, decoded here."""
    from redis.connection import AbstractConnection
    from statement_killer import _resp_commands

    spec = next(s for s in BACKENDS if s.name == "redis")
    sent: Counter[str] = Counter()
    original = AbstractConnection.send_packed_command

    def spy(self: AbstractConnection, command: Any, check_health: bool = True) -> Any:
        chunks = [command] if isinstance(command, str | bytes) else list(command)
        data = b"".join(c.encode() if isinstance(c, str) else bytes(c) for c in chunks)
        for _, _, argv in _resp_commands(data):
            name = argv[0].decode().upper()
            if name in ("CONFIG", "SCRIPT", "CLIENT") and len(argv) > 1:
                name = f"{name} {argv[1].decode().upper()}"
            sent[name] += 1
        return original(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", spy)

    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(spec.store(tmp_path))
        except BackendUnavailable as exc:
            _unavailable("redis", exc)
        _live_through(url)
    assert sent["EVALSHA"] > 20, sent  # the spy saw the library's traffic
    assert not FORBIDDEN & set(sent), sorted(FORBIDDEN & set(sent))


def _live_through(url: str) -> None:
    """Enqueue, run, fail, redrive, purge, prune and read stats on ``url``."""
    app = Conveyor(url, visibility_timeout=5)

    @app.task(name="ok")
    def ok(n: int) -> int:
        return n

    @app.task(name="bad", max_attempts=2)
    def bad(n: int) -> None:
        raise Reject("no")

    good = ok.enqueue_many([(n,) for n in range(20)])
    dead = bad.enqueue(1)
    with running_worker(app):
        for job in good:
            wait_for_job(app, job.id, "succeeded")
        wait_for_job(app, dead.id, "dead")
        assert app.backend.redrive([dead.id]) == 1
        wait_for_job(app, dead.id, "dead")
    app.backend.stats()
    app.backend.list_jobs(limit=5)
    app.backend.prune(older_than=0)
    assert app.backend.purge() == 1
    app.backend.startup_warnings()
    app.close()
