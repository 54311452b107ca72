"""SQS: the local server (moto), the systems as the driver sees them, and the raw baselines.

The server is moto's (``python -m moto.server``), started by the driver for the run alone on a
free loopback port, with dummy AWS credentials in the environment (and no AWS config files), and
stopped at the end by its own pid: every queue goes with it. Each system still names its queues
under a prefix of its own (``bsqs<6 hex>_<system>``), which the driver purges between phases.
The systems' interface is the broker drivers' (``harness/broker_systems.System``), so the
scenarios are the same functions (``harness/rabbitmq_store``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlite_bench import Proc

from harness import broker_systems
from harness.broker_systems import ConveyorCalls

CAVEATS = {
    "conveyor": "Conveyor's SQS transport as it ships (boto3): one standard queue per priority "
    "level (level 0 only here) and a dead queue with a redrive policy (20 receives). A claim is "
    "a ReceiveMessage of up to the free slots (10 at most per call) with VisibilityTimeout = the "
    "lease (30 s); the worker extends it by heartbeat (ChangeMessageVisibility) while a job "
    "runs; an ack first changes the visibility (to check the lease is still held: SQS refuses a "
    "message no longer in flight), then deletes, both as batch calls, and a worker stops using "
    "a receipt past its lease on its own clock (the fence; moto accepts any handle a message "
    "ever had). Attempts are counted from ApproximateReceiveCount, errors and retry delays "
    "travel in the message, max_attempts sends a job to the dead queue. No job record beyond "
    "the message: once deleted the job is gone. An idle worker polls the lanes' "
    "ApproximateNumberOfMessages with pauses growing from 50 ms to 1 s (a long-polling receive "
    "would take the messages and count as their delivery). enqueue_many sends SendMessageBatch "
    "calls of 10, one after the other.",
    "celery": "kombu's SQS transport (boto3 for sends and deletes, pycurl for the worker's "
    "receives): one standard queue; acks_late=True and worker_prefetch_multiplier=1: a message "
    "is received with the queue's visibility timeout (30 s, Conveyor's default lease) and "
    "deleted after the task returns (also when it raised), at most 8 held per worker, a dead "
    "worker's messages come back when the timeout runs out (at-least-once). The visibility "
    "timeout is never extended: a task running longer than it is handed out again while it "
    "runs. No fence: the delete goes out with the receipt handle whatever happened since (moto "
    "and, by its documentation, SQS may accept an old one). No delivery limit or dead queue "
    "unless one is set on the queue; no job record (no result backend). Receives long-poll (10 "
    "s, kombu's default) with kombu's default 1 s pause (polling_interval) after a poll that "
    "took nothing, and a poll made while the worker's 8 slots are all taken counts as one: "
    "with prefetch multiplier 1 a worker runs about 8 jobs per pause; remote control off.",
    "celery-poll50ms": "as celery, with polling_interval=0.05 (the pause after a poll that took "
    "nothing: 50 ms, Conveyor's first idle pause, instead of 1 s).",
    "raw-writes": "no job system: the message body Conveyor sends, with boto3 straight to a "
    "standard queue of its own. enqueue: one SendMessage per message; enqueue_many: "
    "SendMessageBatch calls of 10 (SQS's most), one after the other, as Conveyor sends them.",
}
REGION = "us-east-1"
START_TIMEOUT = 60.0


# -- the server ----------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
        return True
    return False


@contextlib.contextmanager
def aws_dummy_env() -> Iterator[None]:
    """Credentials moto takes and nothing else: boto3 must neither find nor sign with the
    machine's own (if it has any), nor read its AWS config. Restored afterwards."""
    home = tempfile.mkdtemp(prefix="conveyor-harness-aws-")
    wanted = {
        "AWS_ACCESS_KEY_ID": "conveyor-bench",
        "AWS_SECRET_ACCESS_KEY": "conveyor-bench",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": os.path.join(home, "no-config"),
        "AWS_SHARED_CREDENTIALS_FILE": os.path.join(home, "no-credentials"),
    }
    dropped = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SQS")
    saved = {k: os.environ.get(k) for k in [*wanted, *dropped]}
    os.environ.update(wanted)
    for k in dropped:
        os.environ.pop(k, None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        os.rmdir(home)


@contextlib.contextmanager
def moto_server(log_dir: Path) -> Iterator[tuple[str, int]]:
    """moto's server on a free loopback port, from this Python's environment; yields
    (``host:port``, its pid) and stops that process alone at the end."""
    port = _free_port()
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    # moto refuses a second PurgeQueue of a queue within 60 s, as AWS does; the driver purges
    # between phases, seconds apart.
    env = {"MOTO_SQS_ENFORCE_STRICT_QUEUE_PURGE_BEHAVIOUR": "false"}
    proc = Proc("moto-server", argv, log_dir, env=env)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not _answers(port):
            proc.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"moto's server did not answer on 127.0.0.1:{port}")
            time.sleep(0.05)
        yield f"127.0.0.1:{port}", proc.popen.pid
    finally:
        proc.stop()


def moto_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"moto {version('moto')} (python -m moto.server, one process)"
    except PackageNotFoundError:
        return "moto (version unknown)"


def client(endpoint: str) -> Any:
    import boto3

    return boto3.session.Session(region_name=REGION).client(
        "sqs", endpoint_url=f"http://{endpoint}"
    )


# -- the server's queues -------------------------------------------------------------------
class Admin:
    """A boto3 client of the driver's own, for counts and purges."""

    def __init__(self, endpoint: str) -> None:
        self.sqs = client(endpoint)
        self.urls: dict[str, str] = {}

    def url(self, queue: str) -> str | None:
        if queue not in self.urls:
            try:
                self.urls[queue] = self.sqs.get_queue_url(QueueName=queue)["QueueUrl"]
            except self.sqs.exceptions.QueueDoesNotExist:
                return None
        return self.urls[queue]

    def count(self, queue: str) -> int | None:
        """Messages in ``queue``, visible, in flight or delayed (moto counts exactly); None if
        it does not exist."""
        url = self.url(queue)
        if url is None:
            return None
        names = [
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ]
        attrs = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
        return sum(int(attrs.get(n, 0)) for n in names)

    def purge(self, queue: str) -> None:
        url = self.url(queue)
        if url is not None:
            self.sqs.purge_queue(QueueUrl=url)  # moto purges at once

    def close(self) -> None:
        self.sqs.close()


# -- the systems ---------------------------------------------------------------------------
class System(broker_systems.System):
    """A system on the run's moto server (its queues go with the server at the end)."""

    admin: Admin

    def __init__(
        self, a: argparse.Namespace, admin: Admin, endpoint: str, tag: str, probe_addr: str
    ) -> None:
        self.endpoint = endpoint
        env = {
            "BENCH_SQS_ENDPOINT": endpoint,
            "BENCH_SQS_PREFIX": f"bsqs{tag}",
            "BENCH_PROBE_ADDR": probe_addr,
        }
        super().__init__(a, admin, f"bsqs{tag}_{self.name}", env)


class ConveyorSystem(ConveyorCalls, System):
    name = "conveyor"
    has_bulk = True

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        from bench_sqs_conveyor import lane_queues, make_app

        self.url = f"sqs://{self.endpoint}/?prefix={self.prefix}"
        self._queues = lane_queues(self.prefix)
        self.app, self.noop, self.probe = make_app(self.url)

    def queues(self) -> list[str]:
        return self._queues

    def warm(self) -> None:
        self.app.backend.stats()  # opens the clients and looks the lanes up

    def worker_argv(self, k: int = 0) -> list[str]:
        return [
            sys.executable,
            "-m",
            "bench_sqs_conveyor",
            self.url,
            "--concurrency",
            str(self.a.concurrency),
        ]

    def close(self) -> None:
        self.app.close()


class CelerySystem(System):
    name = "celery"
    bulk_na = "no batch write: group/chunks send one message per task"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        import bench_sqs_celery

        self.mod = bench_sqs_celery
        self.queue = self.prefix  # bsqs<tag>_<system>: the two Celery systems' apart
        self.env["BENCH_CELERY_QUEUE"] = self.queue

    def queues(self) -> list[str]:
        return [self.queue]

    def enqueue_n(self, start: int, n: int) -> None:
        send = self.mod.noop.apply_async
        for i in range(start, start + n):
            send((i,), queue=self.queue)

    def send_probe(self, token: str) -> float:
        sent = time.time()
        self.mod.probe.apply_async((token,), queue=self.queue)
        return sent

    def worker_argv(self, k: int = 0) -> list[str]:
        return [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "bench_sqs_celery",
            "worker",
            "-P",
            "threads",
            "-c",
            str(self.a.concurrency),
            "-l",
            "WARNING",
            "-Q",
            self.queue,
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-n",
            f"bench{k}@%h",
        ]

    def close(self) -> None:
        self.mod.app.close()


class CeleryPoll50msSystem(CelerySystem):
    """Celery with kombu's pause after a poll that took nothing at 50 ms instead of 1 s. The
    worker counts a poll made while its 8 slots are full as one: with prefetch multiplier 1,
    the default pause caps a worker near 8 jobs a second."""

    name = "celery-poll50ms"

    def worker_env(self) -> dict[str, str]:
        return {**super().worker_env(), "BENCH_CELERY_POLLING_INTERVAL": "0.05"}


SYSTEM_CLASSES: dict[str, type[System]] = {
    "conveyor": ConveyorSystem,
    "celery": CelerySystem,
    "celery-poll50ms": CeleryPoll50msSystem,
}


# -- the raw baselines ---------------------------------------------------------------------
class RawSend:
    """Conveyor's message body sent with boto3 and no job system: what the client and the
    server cost alone. One standard queue of its own."""

    def __init__(self, admin: Admin, endpoint: str, conveyor: ConveyorSystem) -> None:
        self.admin = admin
        self.sqs = client(endpoint)
        self.queue = f"{conveyor.prefix}_raw"
        # One real message to copy: enqueued by Conveyor, read back, deleted.
        conveyor.reset()
        conveyor.enqueue_n(0, 1)
        lane = admin.url(conveyor.job_queues()[0])
        got = self.sqs.receive_message(QueueUrl=lane, MaxNumberOfMessages=1).get("Messages", [])
        if not got:
            raise RuntimeError("the message Conveyor enqueued is not in its lane")
        self.body = got[0]["Body"]
        self.sqs.delete_message(QueueUrl=lane, ReceiptHandle=got[0]["ReceiptHandle"])
        self.url = self.sqs.create_queue(QueueName=self.queue)["QueueUrl"]

    def one_by_one(self, n: int) -> float:
        """n SendMessage calls, one at a time: seconds."""
        send = self.sqs.send_message
        send(QueueUrl=self.url, MessageBody=self.body)  # warm-up
        t0 = time.perf_counter()
        for _ in range(n):
            send(QueueUrl=self.url, MessageBody=self.body)
        dt = time.perf_counter() - t0
        self._check(n + 1)
        return dt

    def batched(self, n: int) -> float:
        """n messages in SendMessageBatch calls of 10, one call at a time: seconds."""
        send = self.sqs.send_message_batch
        t0 = time.perf_counter()
        for s in range(0, n, 10):
            entries = [{"Id": str(k), "MessageBody": self.body} for k in range(min(10, n - s))]
            reply = send(QueueUrl=self.url, Entries=entries)
            assert not reply.get("Failed"), reply["Failed"]
        dt = time.perf_counter() - t0
        self._check(n)
        return dt

    def _check(self, n: int) -> None:
        got = self.admin.count(self.queue)
        assert got == n, f"raw-writes: {got} messages in {self.queue}, expected {n}"
        self.admin.purge(self.queue)

    def close(self) -> None:
        self.sqs.close()
