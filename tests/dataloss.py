"""What a data loss does to a store, for the tests of job uids: the jobs are gone and the id
counter starts again from where it was before them, so the next enqueues take their ids.
Importable as ``dataloss`` (tests/ is on sys.path).

Redis: every key of the store's prefix is deleted, the id counter with them (a restart without
persistence; an RDB snapshot or a lagging replica taken before the jobs were written). Only
this store's prefix: the server is shared. PostgreSQL and SQLite: every job row is deleted
(step records with them) and the id sequence rewound (a restore of a backup taken before).
A message broker with a companion store: the store's loss (the broker keeps its messages)."""

from __future__ import annotations

import sqlite3
from typing import Any

from conveyor.backends.base import Backend


def lose_everything(backend: Backend) -> None:
    backend = getattr(backend, "state", backend)
    kind = type(backend).__name__
    if kind == "PartitionedRedis":  # every partition loses everything
        for part in backend.parts:  # type: ignore[attr-defined]
            lose_everything(part)
        return
    if kind == "RedisBackend":
        client: Any = backend._transport.r  # type: ignore[attr-defined]
        keys = list(client.scan_iter(match=backend.keys.p + "*", count=1000))  # type: ignore[attr-defined]
        for start in range(0, len(keys), 1000):
            client.delete(*keys[start:start + 1000])
    elif kind == "SqliteBackend":
        with sqlite3.connect(backend.url.removeprefix("sqlite:///")) as conn:
            conn.execute("DELETE FROM conveyor_jobs")
            conn.execute("UPDATE sqlite_sequence SET seq = 0 WHERE name = 'conveyor_jobs'")
    else:
        with backend._tx() as conn:  # type: ignore[attr-defined]
            conn.execute("DELETE FROM conveyor_jobs")
            conn.execute("SELECT setval(pg_get_serial_sequence('conveyor_jobs', 'id'), 1, false)")


def forget_uid(backend: Backend, job_id: int) -> None:
    """Make the job look like one written before the store had uids."""
    backend = getattr(backend, "state", backend)
    if type(backend).__name__ == "PartitionedRedis":
        backend = backend.of_job(job_id)  # type: ignore[attr-defined]
    kind = type(backend).__name__
    if kind == "RedisBackend":
        backend._transport.r.hdel(backend.keys.job(job_id), "uid")  # type: ignore[attr-defined]
    elif kind == "SqliteBackend":
        with sqlite3.connect(backend.url.removeprefix("sqlite:///")) as conn:
            conn.execute("UPDATE conveyor_jobs SET uid = NULL WHERE id = ?", [job_id])
    else:
        with backend._tx() as conn:  # type: ignore[attr-defined]
            conn.execute("UPDATE conveyor_jobs SET uid = NULL WHERE id = %s", [job_id])
