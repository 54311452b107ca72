"""A private ``redis-server`` per test (never the shared one on 6379) and real worker processes.

The server runs in its own session from the test's tmp_path, so it can be SIGKILLed and
restarted on the same port and data directory, as an operator's crash and restart would.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
import redis

HERE = Path(__file__).resolve().parent
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.02) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


class RedisServer:
    def __init__(self, tmp: Path, *, appendonly: bool = True, save: str = "", extra: tuple[str, ...] = ()) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            # Locally this only needs saying; in CI a missing server must not pass for green.
            reason = "redis-server is not installed: the Redis fault tests start their own"
            if os.environ.get("CI") == "true":
                pytest.fail(reason, pytrace=False)
            pytest.skip(reason)
        self.dir = tmp / "redis-data"
        self.dir.mkdir(exist_ok=True)
        self.port = free_port()
        self.args = [
            binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
            "--appendonly", "yes" if appendonly else "no", "--appendfsync", "everysec",
            "--save", save, "--daemonize", "no", "--logfile", str(tmp / "redis.log"), *extra,
        ]
        self.password: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.prefix = f"t{uuid.uuid4().hex[:10]}"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0?prefix={self.prefix}"

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, password=self.password, socket_timeout=2, socket_connect_timeout=1,
                           decode_responses=True)

    def start(self) -> RedisServer:
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        c = self.client()

        def up() -> bool:
            assert self.proc is not None and self.proc.poll() is None, "redis-server exited"
            try:
                return bool(c.ping())
            except redis.BusyLoadingError:
                return False
            except redis.ConnectionError:
                return False

        try:
            wait_until(up, 20, f"redis-server on port {self.port}")
        finally:
            c.close()
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown save, no AOF flush beyond what the kernel already has."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)


class Worker:
    """A real ``python -m conveyor worker`` process on the private server."""

    def __init__(self, tmp: Path, url: str, *args: str, name: str = "worker") -> None:
        env = dict(os.environ)
        env.pop("CONVEYOR_APP", None)
        env["CONVEYOR_URL"] = url
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        self.stderr_path = tmp / f"{name}.stderr"
        with open(tmp / f"{name}.stdout", "wb") as out, open(self.stderr_path, "wb") as err:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "conveyor", "--app", "redisapp:app", "worker", *args],
                env=env, cwd=tmp, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True,
            )

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def wait_started(self, timeout: float = 20) -> None:
        def started() -> bool:
            if self.popen.poll() is not None:
                raise AssertionError(f"worker exited early:\n{self.stderr()}")
            return " started: queues " in self.stderr()

        wait_until(started, timeout, "the worker to start")

    def stop(self) -> int:
        self.popen.send_signal(signal.SIGTERM)
        return self.popen.wait(20)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(10)
