"""The message brokers the tests run against, shared by the broker suite (tests/brokers, through
brokerkit.py) and the conformance suite (tests/conformance/conftest.py): a fresh RabbitMQ prefix
per test, deleted again at the end, and moto's SQS server, one per session.

RabbitMQ: the server is shared, so each test names its queues with a prefix of its own. AMQP
cannot list queues (only the management plugin's HTTP API can, and it is not always there;
rabbitmqctl per test is slow), so ``rabbitmq_prefix`` records every queue a transport of this
process declares with the prefix and deletes them at teardown, with the ladder of delay
exchanges and queues (a fixed set of names per prefix: deleted by name, declared or not, which
also covers the ones a worker process of the test declared). Queues also expire a minute after
their last use (``expires``), for what a crashed run leaves behind.

SQS's server in the tests is moto's (the moto[server] package), started once per session as a
process of its own on a free loopback port, never an in-process mock of the client; each test
gets its own queue-name prefix on it. At the end only that server is stopped, by its pid.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from stores import BackendUnavailable, _unavailable

RABBITMQ_URL = os.environ.get("CONVEYOR_TEST_RABBITMQ_URL",
                              "amqp://guest:guest@127.0.0.1:5672/%2F")


def _rabbitmq_connection() -> Any:
    import pika

    try:
        return pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL + "?connection_attempts=1"
                                                          "&socket_timeout=3"))
    except Exception as exc:
        raise BackendUnavailable(f"cannot connect to RabbitMQ at {RABBITMQ_URL}: {exc}") from exc


@contextlib.contextmanager
def rabbitmq_prefix() -> Iterator[str]:
    """A fresh queue-name prefix on the shared RabbitMQ; what was declared with it is deleted
    afterwards."""
    from conveyor.backends.broker import rabbitmq

    _rabbitmq_connection().close()
    prefix = f"ct{uuid.uuid4().hex[:10]}"
    declared: set[str] = set()
    declare = rabbitmq.RabbitTransport._declare

    def recording(self: rabbitmq.RabbitTransport, ch: Any, lane: Any) -> int:
        if self.prefix == prefix:
            declared.add(self.name(lane))
        return declare(self, ch, lane)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rabbitmq.RabbitTransport, "_declare", recording)
        try:
            yield prefix
        finally:
            delete_prefix(prefix, declared)


def delete_prefix(prefix: str, queues: set[str]) -> None:
    """Delete ``queues`` and the delay ladder of ``prefix`` (deleting what is not there is
    allowed in AMQP 0-9-1 on RabbitMQ, so the ladder goes by name)."""
    from conveyor.backends.broker import rabbitmq

    ladder = [f"{prefix}.delay.{rabbitmq.STEP_MS * 2 ** step}" for step in range(rabbitmq.STEPS)]
    conn = _rabbitmq_connection()
    try:
        ch = conn.channel()
        for name in sorted(queues):
            ch.queue_delete(name)
        for name in ladder:
            ch.queue_delete(name)
            ch.exchange_delete(name)
    finally:
        with contextlib.suppress(Exception):
            conn.close()


START_TIMEOUT = 30.0
# moto takes any credentials; these keep boto3 from looking for the machine's own (and from
# signing with them). A test process and the worker processes it starts both get them.
AWS_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "conveyor-test", "AWS_SECRET_ACCESS_KEY": "conveyor-test"}
AWS_UNSET = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SQS")


def aws_env(home: Path) -> dict[str, str]:
    """The AWS variables of a process that talks to a test's moto server (and unset
    AWS_UNSET)."""
    return {**AWS_CREDENTIALS, "AWS_CONFIG_FILE": str(home / "no-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(home / "no-credentials")}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


def start_moto(port: int, log_path: Path) -> subprocess.Popen[bytes]:
    """``python -m moto.server`` on ``127.0.0.1:port``, returned once it answers there; its
    output in ``log_path``. BackendUnavailable if it does not (the process is ended first)."""
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        except OSError as exc:
            raise BackendUnavailable(f"cannot start moto's server: {exc}") from exc
    deadline = time.monotonic() + START_TIMEOUT
    while not _answers(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            code = proc.poll()
            stop_moto(proc)
            tail = log_path.read_text(errors="replace")[-2000:]
            raise BackendUnavailable(f"moto's server did not start on 127.0.0.1:{port} "
                                     f"(exit code {code}): {tail}")
        time.sleep(0.05)
    return proc


def stop_moto(proc: subprocess.Popen[bytes]) -> None:
    """End the server ``start_moto`` started (its pid alone), if it still runs."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextlib.contextmanager
def moto_server(log_dir: Path) -> Iterator[str]:
    """A moto server on a free loopback port; yields ``host:port``."""
    port = free_port()
    proc = start_moto(port, log_dir / "moto_server.log")
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop_moto(proc)


@pytest.fixture(scope="session")
def sqs_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``host:port`` of the session's SQS server, with the AWS variables for it (aws_env)."""
    home = tmp_path_factory.mktemp("sqs")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in aws_env(home).items():
            mp.setenv(k, v)
        for name in AWS_UNSET:
            mp.delenv(name, raising=False)
        with contextlib.ExitStack() as stack:
            try:
                endpoint = stack.enter_context(moto_server(home))
            except BackendUnavailable as exc:
                _unavailable("sqs", exc)
            yield endpoint
