"""Row-lock order of the worker's multi-row writes (heartbeat, ack_many, the acks riding a
claim, release), and what a lock another transaction holds costs them.

Each collision is forced, not hoped for: a third connection locks the middle job, the first
write (ids in one order) queues behind it holding the rows before it, the second write (the
same ids reversed) is started and runs until it finishes or queues too, and only then the
middle row is let go. Two writes that lock rows in the order of their arrays deadlock here
every time; writes that lock in one global order (by id) cannot.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from pgrig import fresh_schema, with_params
from support import new_job, wait_until

from conveyor.backends.base import Lease
from conveyor.backends.postgres import PostgresBackend

N = 12
LEASE_S = 300.0


@pytest.fixture
def pg_url() -> Iterator[str]:
    with fresh_schema() as url:  # skips locally, fails in CI, if PostgreSQL is unreachable
        yield url


Write = Callable[[PostgresBackend, list[Lease]], object]


def _ack_many(b: PostgresBackend, leases: list[Lease]) -> object:
    return b.ack_many([(x, "1") for x in leases])


def _ack_and_claim(b: PostgresBackend, leases: list[Lease]) -> object:
    return b.ack_and_claim([(x, "1") for x in leases], "default", 4, worker_id="w", lease_s=LEASE_S)


def _heartbeat(b: PostgresBackend, leases: list[Lease]) -> object:
    return b.heartbeat(leases, lease_s=LEASE_S)


def _release(b: PostgresBackend, leases: list[Lease]) -> object:
    return b.release(leases)


PAIRS = {
    "ack_many-vs-heartbeat": (_ack_many, _heartbeat),
    "ack_and_claim-vs-heartbeat": (_ack_and_claim, _heartbeat),
    "ack_many-vs-release": (_ack_many, _release),
    "release-vs-heartbeat": (_release, _heartbeat),
    "heartbeat-vs-ack_many": (_heartbeat, _ack_many),
}


@pytest.mark.parametrize("pair", list(PAIRS))
def test_opposite_orders_never_deadlock(pg_url: str, pair: str) -> None:
    first, second = PAIRS[pair]
    name = f"lockorder-{uuid.uuid4().hex[:10]}"
    url = with_params(pg_url, application_name=name)
    backend = PostgresBackend(url)
    try:
        backend.enqueue_many([new_job() for _ in range(N)])
        jobs = backend.claim("default", N, worker_id="w", lease_s=LEASE_S)
        assert len(jobs) == N
        leases = sorted((Lease(j.id, j.lease_token or "") for j in jobs), key=lambda x: x.job_id)
        middle = leases[N // 2].job_id
        errors: list[BaseException] = []
        done: list[str] = []

        def run(write: Write, order: list[Lease], label: str) -> None:
            try:
                write(backend, order)
            except BaseException as exc:
                errors.append(exc)
            finally:
                done.append(label)

        def waiting() -> int:
            with psycopg.connect(pg_url, autocommit=True) as look:
                row = look.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                                   " AND wait_event_type = 'Lock'", [name]).fetchone()
            assert row is not None
            return int(row[0])

        with psycopg.connect(pg_url) as holder:
            holder.execute("SELECT id FROM conveyor_jobs WHERE id = %s FOR NO KEY UPDATE", [middle])
            one = threading.Thread(target=run, args=(first, leases, "first"))
            one.start()
            # A heartbeat may pass the held row by (SKIP LOCKED) and finish at once.
            wait_until(lambda: waiting() + len(done) == 1, timeout=30, message="first write queued or finished")
            two = threading.Thread(target=run, args=(second, leases[::-1], "second"))
            two.start()
            wait_until(lambda: waiting() + len(done) == 2, timeout=30,
                       message="second write queued or finished")
            holder.rollback()  # let the middle row go: both writes go on from where they are
        one.join(timeout=60)
        two.join(timeout=60)
        assert not one.is_alive() and not two.is_alive()
        assert errors == [], f"{pair}: {errors!r}"
    finally:
        backend.close()


def test_heartbeat_counts_a_row_being_written_as_held_and_never_waits(pg_url: str) -> None:
    """A job whose row another transaction has locked is judged by its last committed version:
    our valid lease stays held (and the heartbeat returns while the lock is still held); a job
    whose committed version is no longer ours is lost, locked or not."""
    backend = PostgresBackend(pg_url)
    try:
        backend.enqueue_many([new_job() for _ in range(3)])
        jobs = backend.claim("default", 3, worker_id="w", lease_s=LEASE_S)
        leases = sorted((Lease(j.id, j.lease_token or "") for j in jobs), key=lambda x: x.job_id)
        busy, gone, free = leases
        assert backend.cancel(gone.job_id)
        with psycopg.connect(pg_url) as holder:
            holder.execute("SET lock_timeout = '5min'")
            holder.execute("SELECT id FROM conveyor_jobs WHERE id = ANY(%s) FOR NO KEY UPDATE",
                           [[busy.job_id, gone.job_id]])
            lost = backend.heartbeat(leases, lease_s=LEASE_S)
            assert lost == {gone.job_id}
            holder.rollback()
        assert backend.heartbeat([busy, free], lease_s=LEASE_S) == set()
    finally:
        backend.close()


@pytest.mark.parametrize("write", ["cancel", "reap", "claim", "heartbeat", "ack_many", "release"])
def test_a_step_recorded_in_an_open_transaction_blocks_no_write_of_the_job(pg_url: str, write: str) -> None:
    """A step record inside transaction() holds a key-share lock on its job's row (the foreign
    key) until the task commits. Writes that change no key must not wait for it: each one
    below runs while that transaction stays open (were it to wait, it would hit the
    statement timeout and raise), and does its work."""
    backend = PostgresBackend(pg_url)
    try:
        backend.enqueue_many([new_job(max_attempts=3)])
        [job] = backend.claim("default", 1, worker_id="w", lease_s=5.0)
        lease = Lease(job.id, job.lease_token or "")
        with backend.completion_connection() as conn:
            backend.record_step(job.id, "charge", '"ok"', connection=conn)
            if write == "cancel":
                assert backend.cancel(job.id)
            elif write == "reap":
                assert backend.reap(now=(job.lease_expires_at or 0) + 60).requeued == [job.id]
            elif write == "claim":
                assert backend.reap(now=(job.lease_expires_at or 0) + 60).requeued == [job.id]
                [again] = backend.claim("default", 1, worker_id="w2", lease_s=5.0)
                assert again.id == job.id and again.attempts == 2
            elif write == "heartbeat":
                assert backend.heartbeat([lease], lease_s=60.0) == set()
            elif write == "ack_many":
                assert backend.ack_many([(lease, "1")]) == [True]
            else:
                assert backend.release([lease]) == [job.id]
            conn.rollback()
    finally:
        backend.close()
