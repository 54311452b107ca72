"""PostgreSQL backend: many machines against one database.

Claims are one ``FOR NO KEY UPDATE SKIP LOCKED`` statement, batched to the worker's free slots;
idle workers sleep on ``LISTEN`` and are woken by ``pg_notify`` from the transaction that
made a job available, with polling as the fallback. Jobs can be enqueued inside the
caller's own transaction, and a task can complete its job (and record its exactly-once
steps) in the transaction that holds its own writes.

Fair sharing keeps its state in two small tables: ``conveyor_queue_clock`` (each queue's
virtual time, raised by the claim statement itself) and ``conveyor_fair_tags`` (each fair
key's last tag, reserved at enqueue by an upsert whose row lock orders concurrent enqueues).

Concurrency and rate limits (backends/base.py) cost nothing while the head of a queue has no
limited jobs (claims.py). A job with a concurrency key that leaves ``running`` wakes idle
workers of its queue.

The modules:

- ``backend.py``: PostgresBackend, put together from the parts below; the worker's writes
  after a claim, maintenance, worker records.
- ``connection.py``: the pools, and the client's own deadline on every connection.
- ``queries.py``: the named statements of ``sql/postgres/queries.sql``, and row helpers.
- ``enqueue.py``: enqueueing (sync, async, in the caller's transaction) and step records.
- ``claims.py``: claims, the limited path for concurrency and rate limits.
- ``admin.py``: get, list, stats, redrive, purge, cancel.
- ``listen.py``: waiting for jobs on LISTEN/NOTIFY.
- ``locks.py``: store-wide locks (session advisory locks).
- ``migrate.py``: schema migrations, safe on big tables in use.
"""

from __future__ import annotations

from .backend import PostgresBackend
from .connection import CONTROL_SIZE, POOL_ROOM
from .enqueue import _insert_params
from .queries import CHANNEL, ENQUEUE_ONE, KEEP_ERRORS, Q

__all__ = [
    "CHANNEL",
    "CONTROL_SIZE",
    "ENQUEUE_ONE",
    "KEEP_ERRORS",
    "POOL_ROOM",
    "PostgresBackend",
    "Q",
    "_insert_params",
]
