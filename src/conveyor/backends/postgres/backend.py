"""PostgresBackend: the parts of the PostgreSQL backend put together, and the worker's writes
after a claim (heartbeat, ack, retry, kill, release), maintenance and worker records."""

from __future__ import annotations

import json
import threading
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row

from ...errors import LeaseLost
from ...job import Job, JobState
from .. import forking
from ..base import MAX_STALLS, ErrorInfo, Lease, ReapResult, WorkerInfo
from .admin import Administering
from .claims import Claiming
from .connection import bounded, translate
from .enqueue import Enqueuing
from .groups import Grouping
from .history import PostgresHistory
from .listen import Listening
from .locks import Locking
from .migrate import LATEST as SCHEMA_VERSION
from .migrate import migrate as migrate_schema
from .outbox import PostgresOutbox
from .queries import (
    CHANNEL,
    KEEP_ERRORS,
    Q,
    error_json,
    forget_batches,
    notify,
    notify_freed,
    row_to_job,
)


class PostgresBackend(Enqueuing, Claiming, Administering, Grouping, Listening, Locking,
                      PostgresHistory, PostgresOutbox):
    supports_transactions = True  # enqueue/ack can join a caller's transaction

    def __init__(self, url: str, *, min_size: int | None = None,
                 max_size: int | None = None) -> None:
        """``max_size`` (or ``?pool_max_size=`` in the URL) fixes the main pool's size; unset, it
        is POOL_ROOM plus the task slots of the workers running in this process
        (reserve_connections)."""
        super().__init__(url, min_size=min_size, max_size=max_size)
        self._listener = None
        self._listen_lock = threading.Lock()
        self._locks = set()
        self._locks_mutex = threading.Lock()
        self._limited_queues = set()
        self._wake_generation = 0
        forking.register(self)
        self._migrate()

    # -- plumbing ---------------------------------------------------------------------------------
    def _after_fork_in_child(self) -> None:
        super()._after_fork_in_child()  # the pools
        # The parent's LISTEN connection and store-wide locks are its sessions (each lock is the
        # parent's to free): kept untouched, as the pools are.
        forking.keep_inherited(self._listener)
        forking.keep_inherited(self._locks)
        self._locks, self._locks_mutex = set(), threading.Lock()
        self._listener = None
        self._listen_lock = threading.Lock()

    def _migrate(self) -> None:
        with self._tx() as conn:
            found = conn.execute("SELECT to_regclass('conveyor_schema_migrations') IS NOT NULL"
                                 " AS ok").fetchone()
            if found and found["ok"]:
                done = conn.execute("SELECT max(version) AS v FROM conveyor_schema_migrations"
                                    ).fetchone()
                if done and done["v"] is not None and done["v"] >= SCHEMA_VERSION:
                    return
        try:
            migrate_schema(self._conninfo)
        except psycopg.Error as exc:
            raise translate(exc) from exc

    def schema_version(self) -> int:
        with self._tx() as conn:
            row = conn.execute("SELECT max(version) AS v FROM conveyor_schema_migrations"
                               ).fetchone()
        return int(row["v"]) if row and row["v"] is not None else 0

    def now(self) -> float:
        with self._tx() as conn:
            row = conn.execute(Q["stats_now"], {"now": None}).fetchone()
        assert row is not None
        return float(row["now"])

    def close(self) -> None:
        with self._listen_lock:
            if self._listener is not None:
                self._listener.close()
                self._listener = None
        self._release_locks()
        self._close_pools()

    # -- worker, after the claim ------------------------------------------------------------------
    def heartbeat(self, leases: Sequence[Lease], *, lease_s: float, now: float | None = None,
                  held: Collection[int] = ()) -> set[int]:
        if not leases:
            return set()
        with self._tx(control=True) as conn:
            rows = conn.execute(
                Q["heartbeat"],
                {"ids": [x.job_id for x in leases], "tokens": [x.token for x in leases],
                 "now": now, "lease_s": lease_s, "held": list(held)},
            ).fetchall()
        kept = {r["id"] for r in rows}
        return {x.job_id for x in leases} - kept

    def take(self, job_id: int, token: str, *, worker_id: str, lease_s: float,
             now: float | None = None, message: str | None = None) -> Job | None:
        with self._tx(control=True) as conn:
            was = conn.execute(Q["take_lock"], {"id": job_id}).fetchone()
            row = conn.execute(Q["take"], {
                "id": job_id, "token": token, "worker_id": worker_id, "lease_s": lease_s,
                "now": now, "keep_errors": KEEP_ERRORS, "message": message}).fetchone()
            if row is None:
                return None
            if was is not None and was["state"] == "running":
                # Its lease was lost: counted as reap counts one.
                conn.execute(Q["count_up"], {"name": "lease_expired", "queues": [row["queue"]]})
            if row["state"] != "running":
                notify_freed(conn, [row])  # spent: dead now, as reap makes it
                return None
            conn.execute(Q["raise_clock"], {"queue": row["queue"], "priority": row["priority"],
                                            "tag": row["fair_tag"]})
        return row_to_job(row)

    def ack(self, lease: Lease, result: str | None, *, now: float | None = None,
            connection: psycopg.Connection[Any] | None = None) -> None:
        """With ``connection``, the ack joins that connection's open transaction (the caller
        commits)."""
        params = {"id": lease.job_id, "token": lease.token, "now": now, "result": result}
        if connection is not None:
            try:
                with bounded(connection), connection.cursor(row_factory=dict_row) as cur:
                    row = cur.execute(Q["ack"], params).fetchone()
                    if row is not None and row["concurrency_key"] is not None:
                        # Delivered when the caller commits, as the ack itself.
                        cur.execute(Q["notify"], {"channel": CHANNEL, "queues": [row["queue"]]})
            except psycopg.Error as exc:
                raise translate(exc) from exc
            if row is None:
                raise LeaseLost(lease.job_id, "ack refused")
            return
        with self._tx(control=True) as conn:
            row = conn.execute(Q["ack"], params).fetchone()
            if row is None:
                raise LeaseLost(lease.job_id, "ack refused")
            notify_freed(conn, [row])

    def ack_many(self, acks: Sequence[tuple[Lease, str | None]], *,
                 now: float | None = None) -> list[bool]:
        if not acks:
            return []
        with self._tx(control=True) as conn:
            rows = conn.execute(
                Q["ack_many"],
                {"ids": [x.job_id for x, _ in acks], "tokens": [x.token for x, _ in acks],
                 "results": [r for _, r in acks], "now": now},
            ).fetchall()
            notify_freed(conn, rows)
        held = {r["id"] for r in rows}
        return [lease.job_id in held for lease, _ in acks]

    def retry(self, lease: Lease, error: ErrorInfo, *, delay: float,
              now: float | None = None) -> JobState:
        with self._tx(control=True) as conn:
            row = conn.execute(
                Q["retry"],
                {"id": lease.job_id, "token": lease.token, "now": now,
                 "delay": max(float(delay), 0.0), "keep_errors": KEEP_ERRORS,
                 "error": error_json(error)},
            ).fetchone()
            if row is None:
                raise LeaseLost(lease.job_id, "retry refused")
            state = JobState(row["state"])
            if state is not JobState.DEAD or row["concurrency_key"] is not None:
                notify(conn, [row["queue"]])
        return state

    def kill(self, lease: Lease, error: ErrorInfo, *, now: float | None = None) -> None:
        with self._tx(control=True) as conn:
            row = conn.execute(
                Q["kill"],
                {"id": lease.job_id, "token": lease.token, "now": now, "keep_errors": KEEP_ERRORS,
                 "error": error_json(error)},
            ).fetchone()
            if row is None:
                raise LeaseLost(lease.job_id, "kill refused")
            notify_freed(conn, [row])

    def release(self, leases: Sequence[Lease], *, now: float | None = None) -> list[int]:
        if not leases:
            return []
        with self._tx(control=True) as conn:
            rows = conn.execute(
                Q["release"],
                {"ids": [x.job_id for x in leases], "tokens": [x.token for x in leases]},
            ).fetchall()
            notify(conn, [r["queue"] for r in rows])
        return sorted(r["id"] for r in rows)

    # -- maintenance ------------------------------------------------------------------------------
    def reap(self, *, limit: int = 1000, now: float | None = None) -> ReapResult:
        with self._tx(control=True) as conn:
            rows = conn.execute(Q["reap"], {"now": now, "limit": limit, "keep_errors": KEEP_ERRORS,
                                            "max_stalls": MAX_STALLS}).fetchall()
            if rows:
                conn.execute(Q["count_up"], {"name": "lease_expired",
                                             "queues": [r["queue"] for r in rows]})
                notify(conn, [r["queue"] for r in rows
                              if r["state"] == "available" or r["concurrency_key"] is not None])
        return ReapResult(
            requeued=sorted(r["id"] for r in rows if r["state"] == "available"),
            dead=sorted(r["id"] for r in rows if r["state"] == "dead"),
            queues={r["id"]: r["queue"] for r in rows},
        )

    def promote(self, *, limit: int = 1000, now: float | None = None) -> int:
        with self._tx(control=True) as conn:
            rows = conn.execute(Q["promote"], {"now": now, "limit": limit}).fetchall()
            notify(conn, [r["queue"] for r in rows])
        return len(rows)

    def prune(
        self, *, older_than: float, states: Sequence[JobState] = (JobState.SUCCEEDED,),
        limit: int = 1000, now: float | None = None,
    ) -> int:
        deleted = 0
        with self._tx(control=True) as conn:
            for state in states:
                if not JobState(state).is_final:
                    raise ValueError(f"prune only deletes finished jobs, not {state}")
                left = limit - deleted
                if left <= 0:
                    break
                row = conn.execute(
                    Q["prune"],
                    {"state": str(state), "older_than": older_than, "limit": left, "now": now},
                ).fetchone()
                assert row is not None
                deleted += row["n"]
                forget_batches(conn, row["batches"])
            conn.execute(Q["prune_fair_tags"], {"limit": limit})
            conn.execute(Q["prune_rate_claims"], {"now": now, "limit": limit})
        return deleted

    # -- workers ----------------------------------------------------------------------------------
    def record_worker(self, info: WorkerInfo, *, now: float | None = None) -> None:
        with self._tx(control=True) as conn:
            conn.execute(
                Q["record_worker"],
                {"id": info.id, "queues": json.dumps(info.queues),
                 "concurrency": info.concurrency, "host": info.host, "pid": info.pid,
                 "started_at": info.started_at, "now": now, "running": info.running,
                 "stuck": info.stuck},
            )
            conn.execute(Q["forget_workers"], {"now": now})

    def remove_worker(self, worker_id: str) -> None:
        with self._tx(control=True) as conn:
            conn.execute(Q["remove_worker"], {"id": worker_id})

    # -- transactional completion -----------------------------------------------------------------
    @contextmanager
    def completion_connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection with an open transaction, for a task's writes plus its ack."""
        try:
            # The task holds it as long as it runs: only our own uses of it are bounded (the
            # probe here, ack/record_step/enqueue/get on it, and the rollback below).
            with self._live_connection(hold=False) as conn:
                conn.autocommit = False
                try:
                    yield conn
                finally:
                    if not conn.closed:
                        with bounded(conn, close=True):
                            conn.rollback()  # no-op after a commit
                            conn.autocommit = True
        except psycopg.Error as exc:
            raise translate(exc) from exc

