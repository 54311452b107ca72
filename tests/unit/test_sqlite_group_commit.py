"""SQLite group commit: enqueues that wait for the write lock together are written in one
transaction, so they share one commit (one fsync under the default synchronous=FULL), and
each call still gets exactly its own outcome.

The store's write lock is held by an outside connection while the calls arrive, the way a
busy store holds it; the test waits (by a deadline, not a sleep) until every call has joined
the waiting group before letting the lock go.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

from support import new_job, wait_until

from conveyor import QueueFull
from conveyor.backends.base import EnqueueResult
from conveyor.backends.sqlite import SqliteBackend


def test_enqueues_waiting_together_share_one_commit_and_keep_their_own_outcome(tmp_path: Path) -> None:
    db = tmp_path / "jobs.db"
    backend = SqliteBackend(f"sqlite:///{db}")
    try:
        backend.enqueue_many([new_job(queue="small")])
        holder = sqlite3.connect(db, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        out: dict[str, list[EnqueueResult] | BaseException] = {}

        def call(name: str, jobs: list[Any]) -> None:
            try:
                out[name] = backend.enqueue_many(jobs)
            except BaseException as exc:
                out[name] = exc

        calls = {
            "a": [new_job(), new_job()],
            "full": [new_job(queue="small", max_depth=1)],  # one waiting already: refused alone
            "b": [new_job()],
            "c": [new_job(unique_key="k"), new_job(unique_key="k")],
        }
        threads = []
        for name, jobs in calls.items():
            threads.append(threading.Thread(target=call, args=(name, jobs)))
            threads[-1].start()
        # The first call leads, waiting for the lock; the others join it.
        wait_until(lambda: backend._group is not None and len(backend._group.calls) == len(calls),
                   message="every call to join one group")
        holder.execute("ROLLBACK")
        holder.close()
        for t in threads:
            t.join(30)

        assert isinstance(out["full"], QueueFull)
        results = {k: v for k, v in out.items() if k != "full"}
        assert all(isinstance(v, list) for v in results.values()), out
        got = [r for v in results.values() for r in v]  # type: ignore[union-attr]
        assert [r.created for r in out["c"]] == [True, False]  # type: ignore[union-attr]
        assert out["c"][0].id == out["c"][1].id  # type: ignore[index]
        created = sorted({r.id for r in got})
        assert len(created) == 4 and created == list(range(created[0], created[0] + 4))
        assert len({r.at for r in got}) == 1  # one transaction: one time of the store
        assert [j.queue for j in backend.list_jobs(limit=100).jobs].count("small") == 1
    finally:
        backend.close()
