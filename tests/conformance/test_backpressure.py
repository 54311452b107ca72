"""Backpressure: a queue's max_depth bounds its waiting jobs; past it, enqueue raises QueueFull
naming the queue, depth and limit, and writes nothing (on every backend)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest
from support import T0, new_job

from conveyor import Conveyor, QueueFull
from conveyor.backends.base import Backend, Lease
from conveyor.errors import ConfigurationError


def _waiting(backend: Backend, queue: str = "default") -> int:
    found = {q.queue: q for q in backend.stats(now=T0 + 1000).queues}.get(queue)
    return (found.available + found.scheduled) if found else 0


def test_enqueue_past_max_depth_is_refused_and_writes_nothing(backend: Backend) -> None:
    job = replace(new_job(), max_depth=2)
    backend.enqueue_many([job, job], now=T0)
    with pytest.raises(QueueFull) as info:
        backend.enqueue_many([job], now=T0)
    err = info.value
    assert (err.queue, err.depth, err.limit) == ("default", 2, 2)
    assert "default" in str(err) and "2" in str(err)
    assert _waiting(backend) == 2


@pytest.mark.needs("cross_queue")
def test_a_batch_that_would_overflow_is_refused_whole(backend: Backend) -> None:
    limited = replace(new_job(), max_depth=3)
    other = new_job(queue="other")
    backend.enqueue_many([limited], now=T0)
    with pytest.raises(QueueFull) as info:
        backend.enqueue_many([other, limited, limited, limited], now=T0)
    assert info.value.depth == 1
    assert _waiting(backend) == 1
    assert _waiting(backend, "other") == 0  # the other queue's job was not written either
    assert len(backend.enqueue_many([limited, limited], now=T0)) == 2  # exactly up to the limit


@pytest.mark.needs("depth")
def test_running_jobs_do_not_count_scheduled_ones_do(backend: Backend) -> None:
    limited = replace(new_job(), max_depth=2)
    backend.enqueue_many([limited, replace(limited, delay=60)], now=T0)
    with pytest.raises(QueueFull):
        backend.enqueue_many([limited], now=T0)
    [running] = backend.claim("default", 1, worker_id="w", lease_s=60, now=T0 + 1)
    backend.enqueue_many([limited], now=T0 + 1)  # the claimed job left the waiting count
    with pytest.raises(QueueFull):
        backend.enqueue_many([limited], now=T0 + 1)
    backend.ack(Lease(running.id, running.lease_token or ""), None, now=T0 + 2)
    with pytest.raises(QueueFull):
        backend.enqueue_many([limited], now=T0 + 2)


@pytest.mark.needs("unique")
def test_a_duplicate_unique_key_takes_no_room(backend: Backend) -> None:
    limited = replace(new_job(unique_key="once"), max_depth=1)
    [first] = backend.enqueue_many([limited], now=T0)
    [again] = backend.enqueue_many([limited], now=T0)
    assert again.id == first.id and not again.created


@pytest.mark.needs("depth")
def test_concurrent_enqueuers_never_overfill(backend: Backend) -> None:
    limited = replace(new_job(), max_depth=10)
    accepted = []
    refused = []
    lock = threading.Lock()

    def producer() -> None:
        for _ in range(5):
            try:
                backend.enqueue_many([limited])
                with lock:
                    accepted.append(1)
            except QueueFull:
                with lock:
                    refused.append(1)

    threads = [threading.Thread(target=producer) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(accepted) == 10 and len(refused) == 20
    assert _waiting(backend) == 10


@pytest.mark.needs("lookup")
def test_app_queue_limit_and_wait_if_full(app: Conveyor) -> None:
    app.queue("mail", max_depth=1)
    metrics = app.enable_metrics(store=False)

    @app.task(queue="mail")
    def send(n: int) -> None: ...

    send.enqueue(1)
    started = time.monotonic()
    with pytest.raises(QueueFull, match="queue 'mail' is full: 1 job"):
        send.enqueue(2)
    assert time.monotonic() - started < 1  # no wait unless asked
    assert metrics.refused.labels("mail")._value.get() == 1
    assert _waiting(app.backend, "mail") == 1

    def drain_soon() -> None:
        time.sleep(0.3)
        app.backend.claim("mail", 1, worker_id="w", lease_s=60)

    helper = threading.Thread(target=drain_soon)
    helper.start()
    job = send.options(wait_if_full=10).enqueue(3)  # waits for room instead of failing
    helper.join()
    assert app.get_job(job.id).args == {"n": 3}
    with pytest.raises(QueueFull):
        send.options(wait_if_full=0.2).enqueue(4)
    assert metrics.refused.labels("mail")._value.get() == 2
    with pytest.raises(ConfigurationError):
        app.queue("mail", max_depth=0)
    app.queue("mail", max_depth=None)
    send.enqueue(5)  # no limit any more
    app.queue("mail", max_depth=2)  # a limit set after the task's last enqueue holds at once
    with pytest.raises(QueueFull):
        send.enqueue(6)
