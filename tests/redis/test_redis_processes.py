"""Real worker processes against a private redis-server: SCRIPT FLUSH under a running worker,
and Redis SIGKILLed and restarted under load (AOF, appendfsync everysec)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from redisrig import RedisServer, Worker, wait_until

from conveyor import ConveyorError, JobState
from conveyor.backends import open_backend
from conveyor.backends.base import Backend, NewJob
from conveyor.errors import StoreUnavailable

pytestmark = pytest.mark.process

WORKER_ARGS = ("--queues", "default", "--concurrency", "8", "--visibility-timeout", "2",
               "--poll-interval", "0.2", "--grace", "5")


def echo_job(n: int, sleep: float = 0.0) -> NewJob:
    return NewJob(task="echo", queue="default", args=f'{{"n": {n}, "sleep": {sleep}}}', max_attempts=20,
                  timeout=30.0)


def unfinished(backend: Backend, ids: list[int]) -> list[int]:
    return [i for i in ids if (j := backend.get(i)) is None or j.state is not JobState.SUCCEEDED]


def test_script_flush_does_not_break_a_running_worker(tmp_path: Path, private_redis: RedisServer) -> None:
    producer = open_backend(private_redis.url)
    worker = Worker(tmp_path, private_redis.url, *WORKER_ARGS)
    admin = private_redis.client()
    try:
        worker.wait_started()
        first = [r.id for r in producer.enqueue_many([echo_job(i) for i in range(50)])]
        wait_until(lambda: not unfinished(producer, first), 30, "the first batch to succeed")

        # Every cached script is gone, the worker's and the producer's: each reloads its own.
        admin.script_flush()
        second = [producer.enqueue_many([echo_job(i, sleep=0.01)])[0].id for i in range(20)]
        time.sleep(0.05)
        admin.script_flush()  # again, while jobs are running: ack/heartbeat must reload too
        third = [r.id for r in producer.enqueue_many([echo_job(i) for i in range(30)])]
        wait_until(lambda: not unfinished(producer, second + third), 30, "the later jobs to succeed")

        assert worker.popen.poll() is None
        assert worker.stop() == 0
        log = worker.stderr()
        assert "Traceback" not in log and "NOSCRIPT" not in log, log
        for i in first + second + third:
            j = producer.get(i)
            assert j is not None and j.attempts == 1 and j.errors == []
    finally:
        worker.kill()
        admin.close()
        producer.close()


def test_redis_killed_and_restarted_under_load_loses_no_acknowledged_job(
    tmp_path: Path, private_redis: RedisServer
) -> None:
    producer = open_backend(private_redis.url)
    worker = Worker(tmp_path, private_redis.url, *WORKER_ARGS)
    acked: list[int] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def produce() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                [res] = producer.enqueue_many([echo_job(n, sleep=0.002)])
            except ConveyorError as exc:
                failures.append(exc)
                time.sleep(0.05)
                continue
            except BaseException as exc:  # anything else is a bug: record it for the assert
                failures.append(exc)
                return
            acked.append(res.id)
            time.sleep(0.001)

    thread = threading.Thread(target=produce, daemon=True)
    try:
        worker.wait_started()
        thread.start()
        wait_until(lambda: len(acked) >= 300, 30, "300 acknowledged enqueues before the crash")

        private_redis.kill()
        wait_until(lambda: len(failures) >= 2, 20, "enqueues to fail while Redis is down")
        # Counted only now: a call answered just before the kill may be appended after it,
        # but the producer is one thread, so once its calls fail every earlier one is in.
        before = len(acked)
        time.sleep(1.0)  # down for a while: the worker's claims, waits and heartbeats fail too
        assert len(acked) == before, "an enqueue succeeded while Redis was down"

        private_redis.start()  # same port, same dir: replays the AOF
        wait_until(lambda: len(acked) >= before + 300, 60, "300 acknowledged enqueues after the restart")
        stop.set()
        thread.join(10)

        # Every enqueue that returned ends succeeded: none lost in the crash, and the worker
        # (never restarted) found its way back to Redis by itself.
        wait_until(lambda: not unfinished(producer, acked), 90,
                   f"all {len(acked)} acknowledged jobs to succeed")
        assert worker.popen.poll() is None, worker.stderr()

        assert failures, "no enqueue failed while Redis was down"
        assert all(isinstance(f, StoreUnavailable) for f in failures), failures[:3]
        assert "unreachable" in str(failures[0])
        assert worker.stop() == 0
    finally:
        stop.set()
        worker.kill()
        producer.close()
