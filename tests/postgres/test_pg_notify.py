"""LISTEN/NOTIFY on PostgreSQL: a busy worker lets no wake-ups pile up, and an enqueue sends
at most one notification per queue.

The server keeps every notification until each listening session has read it: a worker that
listens while it is busy (no idle wait reading its connection) holds them all, and at the
server's 8 GB limit every transaction that notifies fails. The channel is one per database,
so each test uses queue names of its own and counts only their notifications; a sentinel
notification sent after the work marks the end of what a listener can have received.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Iterator

import psycopg
import pytest
from pgrig import fresh_schema
from support import new_job, running_worker, wait_for_job, wait_until

from conveyor import Conveyor
from conveyor.backends.postgres import CHANNEL, PostgresBackend

ENQUEUES = 2000


@pytest.fixture
def pg_url() -> Iterator[str]:
    with fresh_schema() as url:
        yield url


def a_queue() -> str:
    return f"q{uuid.uuid4().hex[:10]}"


def send_sentinel(url: str, payload: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_notify(%s, %s)", [CHANNEL, payload])


def read_until(conn: psycopg.Connection[object], sentinel: str) -> Counter[str]:
    """Payloads received on ``conn`` up to ``sentinel`` (which the caller sent last)."""
    seen: Counter[str] = Counter()
    for note in conn.notifies(timeout=30):
        if note.payload == sentinel:
            return seen
        seen[note.payload] += 1
    raise AssertionError(f"the sentinel {sentinel!r} never came")


def test_a_busy_worker_lets_no_notifications_pile_up_on_its_listener(pg_url: str) -> None:
    queue = a_queue()
    app = Conveyor(pg_url)
    release = threading.Event()

    @app.task(name="block", queue=queue)
    def block() -> None:
        release.wait(60)

    @app.task(name="noop", queue=queue)
    def noop() -> None:
        pass

    backend = app.backend
    assert isinstance(backend, PostgresBackend)
    try:
        with running_worker(app, queues=queue, concurrency=1, poll_interval=0.2):
            # The worker has waited for work once: it has its LISTEN connection.
            wait_until(lambda: backend._listener is not None, timeout=10, message="the worker's first idle wait")
            blocker = block.enqueue()
            wait_for_job(app, blocker.id, "running")
            for _ in range(ENQUEUES):  # each enqueue its own transaction: one notification each
                noop.enqueue()
            sentinel = f"{queue}:end"
            send_sentinel(pg_url, sentinel)
            with backend._listen_lock:  # the worker is busy: it is not waiting on the listener
                conn = backend._listener
                assert conn is not None
                listening = [r["pg_listening_channels"] for r in
                             conn.execute("SELECT pg_listening_channels()").fetchall()]
                if listening:
                    pending = read_until(conn, sentinel)[queue]
                else:
                    pending = sum(1 for note in conn.notifies(timeout=0) if note.payload == queue)
            release.set()
    finally:
        release.set()
        app.close()
    assert pending == 0, f"{pending} of {ENQUEUES} wake-ups waited on a busy worker's listener"


def test_one_notification_per_queue_per_transaction(pg_url: str) -> None:
    q1, q2 = a_queue(), a_queue()
    backend = PostgresBackend(pg_url)
    listener = psycopg.connect(pg_url, autocommit=True)
    try:
        listener.execute(f"LISTEN {CHANNEL}")
        backend.enqueue_many([new_job(queue=q1) for _ in range(1000)])  # plain jobs: one statement
        backend.enqueue_many([new_job(queue=q1, unique_key=f"u{i}") for i in range(50)]  # the planned path
                             + [new_job(queue=q2) for _ in range(50)])
        backend.enqueue_many([new_job(queue=q1, unique_key="u0")])  # a duplicate: nothing new, no wake-up
        with psycopg.connect(pg_url) as conn:  # the caller's transaction, three batches in it
            for _ in range(3):
                backend.enqueue_many([new_job(queue=q2) for _ in range(10)], connection=conn)
        sentinel = f"{q1}:end"
        send_sentinel(pg_url, sentinel)
        seen = read_until(listener, sentinel)
    finally:
        listener.close()
        backend.close()
    assert (seen[q1], seen[q2]) == (2, 2)
