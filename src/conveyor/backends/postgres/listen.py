"""Idle workers sleep on ``LISTEN`` and are woken by ``pg_notify`` from the transaction that
made a job available (queries.notify), with polling as the fallback.

The LISTEN connection is one per backend, outside the pools, and listens only while a worker
waits: the server keeps each notification until every listening session has read it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import psycopg
from psycopg.rows import dict_row

from ...errors import StoreUnavailable
from .connection import Conn, Guard, PooledBackend, call_budget, configure, translate
from .queries import CHANNEL, Q

DONE_CHANNEL = "conveyor_done"  # job.wait: the id of a finished job marked waited

DRAIN_AT_ONCE = 10_000  # notifications an idle wait reads before it looks (a bound under a flood)


class Listening(PooledBackend):
    """wait_for_jobs, ready_queues and wake of PostgresBackend."""

    _listener: Conn | None
    _listen_lock: threading.Lock
    _wake_generation: int

    def wait_for_jobs(self, queues: Sequence[str], timeout: float, *, verify: bool = True) -> bool:
        start = time.monotonic()
        deadline = start + timeout
        # The client's bound on the LISTEN connection for the whole call: the wait plus one
        # call's budget (a stalled server never wakes us, nor answers the readiness query).
        until = deadline + call_budget()
        generation = self._wake_generation
        wanted = set(queues)
        with self._listen_lock:
            try:
                conn = self._listen_connection(until)
                with Guard(conn, until, close=True):
                    # Listening only while waiting: the server keeps each notification until
                    # every listening session has read it, and a busy worker reads nothing, so
                    # one that stayed listening would hold them all (the queue has a fixed
                    # size, and when it is full every notifying transaction fails). LISTEN
                    # comes before the first look, so a job enqueued in between is seen by one
                    # or the other.
                    conn.execute(f"LISTEN {CHANNEL}")
                    try:
                        return self._wait_listening(conn, queues, wanted, deadline, generation,
                                                    verify)
                    finally:
                        self._unlisten(conn)
            except StoreUnavailable:
                self._drop_listener()
                raise
            except psycopg.Error as exc:
                self._drop_listener()
                raise translate(exc) from exc

    def wake(self) -> None:
        self._wake_generation += 1

    def ready_queues(self, queues: Sequence[str]) -> list[str]:
        if not queues:
            return []
        with self._tx() as conn:
            rows = conn.execute(Q["ready_queues"], {"queues": list(queues)}).fetchall()
        return [r["queue"] for r in rows]

    @contextlib.contextmanager
    def finish_watch(self, job_id: int) -> Iterator[Callable[[float], None]]:
        """LISTEN on conveyor_done on a connection of the wait's own, then mark the job
        (``waited``): the statements that finish a marked job notify its id (see
        009_job_waited.sql). A finish between the mark and the first look is a notification
        already queued, so none is missed."""
        wanted = str(job_id)
        try:
            conn = psycopg.connect(self._conninfo, autocommit=True, row_factory=dict_row)
        except psycopg.Error as exc:
            raise translate(exc) from exc
        try:
            with Guard(conn, time.monotonic() + call_budget(), close=True):
                configure(conn)
                conn.execute(f"LISTEN {DONE_CHANNEL}")
            with self._tx() as tx:
                tx.execute(Q["mark_waited"], {"id": job_id})

            def sleep(seconds: float) -> None:
                try:
                    for note in conn.notifies(timeout=seconds):
                        if note.payload == wanted:
                            return
                except psycopg.Error as exc:
                    raise translate(exc) from exc

            yield sleep
        finally:
            conn.close()

    def _unlisten(self, conn: Conn) -> None:
        if conn.closed or conn.broken:
            self._drop_listener()
            return
        try:
            conn.execute(f"UNLISTEN {CHANNEL}")
            # What came before the UNLISTEN: read it now, or it would wait in the connection's
            # backlog for the next wait.
            for _ in conn.notifies(timeout=0):
                pass
        except psycopg.Error:
            self._drop_listener()  # a closed session listens to nothing either

    def _wait_listening(self, conn: Conn, queues: Sequence[str], wanted: set[str],
                        deadline: float, generation: int, verify: bool) -> bool:
        look = True
        while self._wake_generation == generation:
            if look:
                row = conn.execute(Q["ready"], {"queues": list(queues)}).fetchone()
                assert row is not None
                if row["ready"]:
                    return True
                if row["next_due_in"] is not None:
                    deadline = min(deadline, time.monotonic() + max(0.0, row["next_due_in"]))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            # Short slices so wake() (shutdown) is noticed without a round trip. A notification
            # only means "look again": it can be stale (its job claimed already, or seen by the
            # last look), and reporting work that is not there would make the worker read its
            # empty claim as limits holding jobs back, and back off. Everything that has come
            # in is read at once, so a burst of enqueues costs one look, not one each.
            notes = [*conn.notifies(timeout=min(remaining, 0.1), stop_after=1),
                     *conn.notifies(timeout=0, stop_after=DRAIN_AT_ONCE)]
            look = any(note.payload in wanted for note in notes)
            if look and not verify:
                return True
        return True

    def _listen_connection(self, until: float) -> Conn:
        if self._listener is None or self._listener.closed:
            # Bounded by connect_timeout.
            conn = psycopg.connect(self._conninfo, autocommit=True, row_factory=dict_row)
            self._listener = conn
            with Guard(conn, until, close=True):
                configure(conn)
        return self._listener

    def _drop_listener(self) -> None:
        if self._listener is not None:
            try:
                self._listener.close()
            except psycopg.Error:
                pass
            finally:
                self._listener = None
