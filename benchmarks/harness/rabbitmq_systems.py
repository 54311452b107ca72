"""RabbitMQ: the systems as the driver sees them (producer calls, queue names, worker command),
the broker housekeeping (counts, purges, deletes), the probe listener and the raw baselines.

Every system declares its queues and exchanges under a prefix of its own, unique to the run
(``benchrmq-<6 hex>-<system>``): the driver purges them between phases and deletes them at the
end, and touches nothing else on the broker. Every queue is a quorum queue and every publish
waits for the broker's confirm, in all four systems (see each ``bench_rabbitmq_*`` module, and
``CAVEATS`` for what each one keeps or does not).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import sys
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import pika
import pika.exceptions as pex
from sqlite_bench import BATCH, Proc

from harness import broker_systems
from harness.broker_systems import ConveyorCalls

CAVEATS = {
    "conveyor": "quorum-queue lanes, one per priority level (-1, 0, 1); persistent messages; every "
    "publish waits for its confirm, one at a time (pika's blocking channel), enqueue_many too. "
    "Claims are basic.get with manual acks: the worker's connection is the lease (a dead or "
    "frozen worker's messages come back; x-delivery-count is counted as an attempt, past "
    "max_attempts the job goes to the dead lane; x-delivery-limit is the broker's backstop). "
    "Delivery tags die with their channel, so a worker whose connection died cannot ack a "
    "redelivered attempt. The job's lifecycle (attempts, errors, retry delays, the dead lane) "
    "travels in its message; no job record beyond it: once acked the job is gone (no lookup, "
    "no result, no history on this store alone). An idle worker polls the lanes' depth "
    "(queue.declare, one per lane) with a backoff of 20 to 250 ms.",
    "conveyor-prefetch": "as conveyor, with Worker(prefetch=concurrency): up to that many more "
    "jobs received and held until a slot frees (opt-in).",
    "celery": "one quorum queue; persistent messages; confirm_publish (each delay() waits for "
    "its confirm); acks_late=True and worker_prefetch_multiplier=1: acked after the task "
    "returns (also when it raised), at most 8 unacked messages per worker, a dead worker's "
    "messages come back (at-least-once; the same broker fence as Conveyor's: a dead "
    "connection's tags cannot ack). No delivery limit: a message that kills its worker comes "
    "back forever (RabbitMQ 3.10's quorum queues have none by default). No job record (no "
    "result backend). basic.consume: the broker pushes, no polling. Remote control and native "
    "delayed delivery off (unused here; they declare objects with global names).",
    "dramatiq": "RabbitmqBroker with confirm_delivery=True (its default is off); persistent "
    "messages; the queue and its delay queue declared as quorum queues by a 4-line subclass "
    "(Dramatiq declares classic ones); manual ack after the actor returns, prefetch 8 (default "
    "16): a dead worker's messages come back (at-least-once, the broker's fence). Retries "
    "(20 by default, through the delay queue) then the .XQ dead-letter queue, kept 7 days. No "
    "job record. basic.consume: push, no polling.",
    "taskiq": "taskiq-aio-pika as it ships: quorum queue, persistent messages, publisher "
    "confirms (aio-pika awaits each); manual ack once the task is done (ack type when_saved), "
    "qos 8 (default 10): at-least-once, the broker's fence. No retries unless a middleware is "
    "added; no job record (no result backend). basic.consume: push, no polling. Tasks are "
    "async def. One worker process under Taskiq's supervisor (--workers 1).",
    "raw-writes": "no job system: the message body Conveyor publishes, straight to a quorum "
    "queue of its own. enqueue: pika's blocking channel, one publish and its confirm at a time "
    "(Conveyor's client and pattern). enqueue_many: aio-pika, 1000 publishes per batch with "
    "their confirms in flight together.",
}


# -- the broker ----------------------------------------------------------------------------
class Admin:
    """One pika connection of the driver's own, for counts, purges and deletes."""

    def __init__(self, url: str) -> None:
        self.params = pika.URLParameters(url)
        self.params.heartbeat = 0  # idle for minutes between phases: no heartbeats to miss
        self.conn: Any = None
        self.ch: Any = None

    def channel(self) -> Any:
        if self.conn is None or not self.conn.is_open:
            self.conn = pika.BlockingConnection(self.params)
            self.ch = None
        if self.ch is None or not self.ch.is_open:
            self.ch = self.conn.channel()
        return self.ch

    def count(self, queue: str) -> int | None:
        """Ready messages in ``queue``; None if it does not exist."""
        try:
            return int(self.channel().queue_declare(queue, passive=True).method.message_count)
        except pex.ChannelClosedByBroker as exc:
            if exc.reply_code == 404:
                return None
            raise

    def purge(self, queue: str) -> None:
        if self.count(queue) is not None:
            self.channel().queue_purge(queue)

    def delete(self, queues: list[str], exchanges: list[str]) -> None:
        ch = self.channel()
        for q in queues:
            ch.queue_delete(q)
        for e in exchanges:
            ch.exchange_delete(e)

    def close(self) -> None:
        if self.conn is not None and self.conn.is_open:
            with contextlib.suppress(Exception):
                self.conn.close()


def broker_pid(url: str) -> int | None:
    """The pid of the process listening on the broker's port on this machine, or None."""
    port = urlsplit(url).port or 5672
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[1].endswith(f":{port:04X}"):  # LISTEN
                    inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                        return int(pid)
    return None


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of ``pid`` (all its threads), or None."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the probe reports -------------------------------------------------------------------
class ProbeListener:
    """Reads the probe bodies' UDP reports (``bench_rabbitmq_common.probe_started``) on a thread,
    so none is lost while the driver is busy enqueueing."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self.sock.bind(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.got: dict[str, float] = {}
        self.cond = threading.Condition()
        threading.Thread(target=self._read, name="probe-listener", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(512)
            except OSError:
                return  # closed
            token, at = data.decode().split()
            with self.cond:
                self.got[token] = float(at)
                self.cond.notify_all()

    def clear(self) -> None:
        with self.cond:
            self.got.clear()

    def wait(self, tokens: set[str], timeout: float, procs: tuple[Proc, ...]) -> dict[str, float]:
        """The start times of ``tokens``, once every one has reported."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not tokens <= self.got.keys():
                for p in procs:
                    p.check_alive()
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = len(tokens - self.got.keys())
                    raise TimeoutError(f"{missing} probes did not run within {timeout:g}s")
                self.cond.wait(min(left, 1.0))
            return {t: self.got[t] for t in tokens}

    def close(self) -> None:
        self.sock.close()


# -- the systems ---------------------------------------------------------------------------
class System(broker_systems.System):
    """A system on the broker: its queues and exchanges are deleted at the end."""

    admin: Admin

    def __init__(self, a: argparse.Namespace, admin: Admin, tag: str, probe_addr: str) -> None:
        prefix = f"benchrmq-{tag}-{self.name}"
        env = {
            "BENCH_AMQP_URL": a.amqp,
            "BENCH_RABBITMQ_PREFIX": prefix,
            "BENCH_PROBE_ADDR": probe_addr,
        }
        super().__init__(a, admin, prefix, env)

    def exchanges(self) -> list[str]:
        return []

    def close_producer(self) -> None:
        pass

    def close(self) -> None:
        try:
            self.close_producer()
        finally:
            self.admin.delete(self.queues(), self.exchanges())


def with_query(url: str, **params: str) -> str:
    extra = "&".join(f"{k}={v}" for k, v in params.items())
    return url + ("&" if "?" in url else "?") + extra


class ConveyorSystem(ConveyorCalls, System):
    name = "conveyor"
    has_bulk = True

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        from bench_rabbitmq_conveyor import lane_queues, make_app

        self.url = with_query(self.a.amqp, prefix=self.prefix)
        self._queues = lane_queues(self.prefix)
        self.app, self.noop, self.probe = make_app(self.url)

    def queues(self) -> list[str]:
        return self._queues

    def job_queues(self) -> list[str]:
        return self._queues[:-1]  # the lanes, not the dead one

    def warm(self) -> None:
        # Connects and declares the lanes (stats reads each lane's count). Not wait_for_jobs:
        # that starts consumers, which would take messages into this producer's prefetch.
        self.app.backend.stats()

    def worker_argv(self, k: int = 0) -> list[str]:
        return [
            sys.executable,
            "-m",
            "bench_rabbitmq_conveyor",
            self.url,
            "--concurrency",
            str(self.a.concurrency),
        ]

    def close_producer(self) -> None:
        self.app.close()


class ConveyorPrefetchSystem(ConveyorSystem):
    name = "conveyor-prefetch"

    def worker_argv(self, k: int = 0) -> list[str]:
        return [*super().worker_argv(k), "--prefetch", str(self.a.concurrency)]


class CelerySystem(System):
    name = "celery"
    bulk_na = "no batch write: group/chunks publish one message per task"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        import bench_rabbitmq_celery

        self.mod = bench_rabbitmq_celery

    def queues(self) -> list[str]:
        return [self.mod.QUEUE]

    def exchanges(self) -> list[str]:
        return [self.mod.QUEUE]

    def enqueue_n(self, start: int, n: int) -> None:
        delay = self.mod.noop.delay
        for i in range(start, start + n):
            delay(i)

    def send_probe(self, token: str) -> float:
        sent = time.time()
        self.mod.probe.delay(token)
        return sent

    def worker_argv(self, k: int = 0) -> list[str]:
        return [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "bench_rabbitmq_celery",
            "worker",
            "-P",
            "threads",
            "-c",
            str(self.a.concurrency),
            "-l",
            "WARNING",
            "-Q",
            self.mod.QUEUE,
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-n",
            f"bench{k}@%h",
        ]

    def close_producer(self) -> None:
        self.mod.app.close()


class DramatiqSystem(System):
    name = "dramatiq"
    bulk_na = "no batch enqueue (group() sends one message at a time)"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        import bench_rabbitmq_dramatiq

        self.mod = bench_rabbitmq_dramatiq

    def queues(self) -> list[str]:
        q = self.mod.QUEUE
        return [q, f"{q}.DQ", f"{q}.XQ"]

    def enqueue_n(self, start: int, n: int) -> None:
        send = self.mod.noop.send
        for i in range(start, start + n):
            send(i)

    def send_probe(self, token: str) -> float:
        sent = time.time()
        self.mod.probe.send(token)
        return sent

    def worker_argv(self, k: int = 0) -> list[str]:
        return [
            sys.executable,
            "-m",
            "dramatiq",
            "bench_rabbitmq_dramatiq",
            "-p",
            "1",
            "-t",
            str(self.a.concurrency),
            "-Q",
            self.mod.QUEUE,
        ]

    def worker_env(self) -> dict[str, str]:
        return {**self.env, "dramatiq_queue_prefetch": str(self.a.concurrency)}

    def close_producer(self) -> None:
        self.mod.broker.close()


class TaskiqSystem(System):
    name = "taskiq"
    bulk_na = "no batch enqueue (kiq() publishes one message)"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        import bench_rabbitmq_taskiq

        self.mod = bench_rabbitmq_taskiq
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self.mod.broker.startup())

    def queues(self) -> list[str]:
        return [self.mod.QUEUE, self.mod.DEAD]

    def exchanges(self) -> list[str]:
        return [self.mod.QUEUE]

    def enqueue_n(self, start: int, n: int) -> None:
        async def go() -> None:
            kiq = self.mod.noop.kiq
            for i in range(start, start + n):
                await kiq(i)

        self.loop.run_until_complete(go())

    def send_probe(self, token: str) -> float:
        async def go() -> float:
            sent = time.time()
            await self.mod.probe.kiq(token)
            return sent

        return self.loop.run_until_complete(go())

    def worker_argv(self, k: int = 0) -> list[str]:
        return [
            sys.executable,
            "-m",
            "taskiq",
            "worker",
            "bench_rabbitmq_taskiq:broker",
            "--workers",
            "1",
            "--max-async-tasks",
            str(self.a.concurrency),
            "--log-level",
            "WARNING",
        ]

    def close_producer(self) -> None:
        self.loop.run_until_complete(self.mod.broker.shutdown())
        self.loop.close()


SYSTEM_CLASSES: dict[str, type[System]] = {
    "conveyor": ConveyorSystem,
    "conveyor-prefetch": ConveyorPrefetchSystem,
    "celery": CelerySystem,
    "dramatiq": DramatiqSystem,
    "taskiq": TaskiqSystem,
}


# -- the raw baselines ---------------------------------------------------------------------
class RawPublish:
    """Conveyor's message body published with no job system: what the client and the broker
    cost alone. One queue of its own (a quorum queue, as Conveyor's lanes)."""

    def __init__(self, a: argparse.Namespace, admin: Admin, conveyor: ConveyorSystem) -> None:
        self.a = a
        self.admin = admin
        self.queue = f"{conveyor.prefix}.raw"
        # One real message to copy: enqueued by Conveyor, read back, given back.
        conveyor.reset()
        conveyor.enqueue_n(0, 1)
        for lane in conveyor.job_queues():
            if not admin.count(lane):  # declared only once a job goes there
                continue
            method, _, body = admin.channel().basic_get(lane, auto_ack=True)
            if method is not None:
                self.body = bytes(body)
                break
        else:
            raise RuntimeError("the message Conveyor enqueued is not in its lanes")
        self.args = {"x-queue-type": "quorum"}

    def one_by_one(self, n: int) -> float:
        """n publishes on pika's blocking channel, each waiting for its confirm: seconds."""
        conn = pika.BlockingConnection(pika.URLParameters(self.a.amqp))
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare(self.queue, durable=True, arguments=self.args)
            props = pika.BasicProperties(delivery_mode=2, content_type="application/json")
            ch.basic_publish("", self.queue, self.body, props, mandatory=True)  # warm-up
            t0 = time.perf_counter()
            for _ in range(n):
                ch.basic_publish("", self.queue, self.body, props, mandatory=True)
            dt = time.perf_counter() - t0
        finally:
            conn.close()
        self._check(n + 1)
        return dt

    def batched(self, n: int) -> float:
        """n publishes on aio-pika, BATCH at a time with their confirms in flight: seconds."""
        import aio_pika

        async def go() -> float:
            conn = await aio_pika.connect(self.a.amqp)
            try:
                ch = await conn.channel(publisher_confirms=True)
                await ch.declare_queue(self.queue, durable=True, arguments=self.args)
                ex = ch.default_exchange
                t0 = time.perf_counter()
                for s in range(0, n, BATCH):
                    await asyncio.gather(
                        *(
                            ex.publish(
                                aio_pika.Message(
                                    self.body, delivery_mode=2, content_type="application/json"
                                ),
                                routing_key=self.queue,
                                mandatory=True,
                            )
                            for _ in range(min(BATCH, n - s))
                        )
                    )
                return time.perf_counter() - t0
            finally:
                await conn.close()

        dt = asyncio.run(go())
        self._check(n)
        return dt

    def _check(self, n: int) -> None:
        got = self.admin.count(self.queue)
        assert got == n, f"raw-writes: {got} messages in {self.queue}, expected {n}"
        self.admin.delete([self.queue], [])
