"""Inspection and administration on PostgreSQL: get, list, stats, redrive, purge, cancel,
cancel_many."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row

from ...job import Job, JobState
from ...payload import check_queue_name
from ..base import BatchInfo, Page, Stats, WorkerInfo, check_filters, queue_stats_from_rows
from .connection import PooledBackend, bounded, translate
from .enqueue import retag_plan, run_plan
from .queries import Q, forget_batches, notify, notify_freed, row_to_job


class Administering(PooledBackend):
    """What the CLI, the dashboard and the app's own calls read and change."""

    def get(self, job_id: int, *, connection: psycopg.Connection[Any] | None = None) -> Job | None:
        """With ``connection``, read through it (sees that transaction's uncommitted jobs)."""
        if connection is not None:
            try:
                with bounded(connection), connection.cursor(row_factory=dict_row) as cur:
                    row = cur.execute(Q["get"], {"id": job_id}).fetchone()
            except psycopg.Error as exc:
                raise translate(exc) from exc
            return row_to_job(row) if row else None
        with self._tx() as conn:
            row = conn.execute(Q["get"], {"id": job_id}).fetchone()
        return row_to_job(row) if row else None

    async def aget(self, job_id: int, *, connection: psycopg.AsyncConnection[Any]) -> Job | None:
        try:
            with bounded(connection):
                async with connection.cursor(row_factory=dict_row) as cur:
                    await cur.execute(Q["get"], {"id": job_id})
                    row = await cur.fetchone()
        except psycopg.Error as exc:
            raise translate(exc) from exc
        return row_to_job(row) if row else None

    def get_batch(self, batch_id: str) -> BatchInfo | None:
        with self._tx() as conn:
            row = conn.execute(Q["get_batch"], {"id": batch_id}).fetchone()
        if row is None:
            return None
        n = row["counts"]
        return BatchInfo(
            id=row["id"], created_at=row["created_at"], parent_id=row["parent_id"],
            total=sum(n.values()), waiting=n.get("waiting", 0),
            pending=n.get("scheduled", 0) + n.get("available", 0) + n.get("running", 0),
            succeeded=n.get("succeeded", 0), dead=n.get("dead", 0),
            cancelled=n.get("cancelled", 0), on_success=row["on_success"],
            on_complete=row["on_complete"])

    def list_jobs(
        self, *, state: JobState | None = None, queue: str | None = None, task: str | None = None,
        cursor: int | None = None, limit: int = 50,
    ) -> Page:
        check_filters(queue=queue, task=task)
        where: list[str] = []
        params: dict[str, Any] = {"limit": limit + 1}
        filters = (("state", str(state) if state is not None else None), ("queue", queue),
                   ("task", task))
        for column, value in filters:
            if value is not None:
                where.append(f"{column} = %({column})s")
                params[column] = value
        if cursor is not None:
            where.append("id < %(cursor)s")
            params["cursor"] = cursor
        sql = Q["job_rows"]
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT %(limit)s"
        with self._tx() as conn:
            rows = conn.execute(sql.encode(), params).fetchall()
        jobs = [row_to_job(r) for r in rows[:limit]]
        return Page(jobs=jobs, next_cursor=jobs[-1].id if len(rows) > limit and jobs else None)

    def stats(self, *, now: float | None = None, worker_ttl: float = 60.0,
              finished: bool = True) -> Stats:
        with self._tx() as conn:
            # REPEATABLE READ: every number from one snapshot.
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            p = {"now": now}
            row = conn.execute(Q["stats_now"], p).fetchone()
            assert row is not None
            t = float(row["now"])
            counted = Q["count_by_state" if finished else "count_unfinished"]
            counts = conn.execute(counted).fetchall()
            due = conn.execute(Q["due_scheduled"], p).fetchall()
            oldest = conn.execute(Q["oldest_available"]).fetchall()
            counters = conn.execute(Q["counters"]).fetchall()
            expired = conn.execute(Q["expired_leases"], p).fetchall()
            workers = conn.execute(Q["workers"], {"now": now, "ttl": worker_ttl}).fetchall()
            paused = conn.execute(Q["paused_queues"]).fetchall()
        queues = queue_stats_from_rows(t, counts, due, oldest, counters, expired,
                                       {r["queue"]: r["paused_at"] for r in paused})
        return Stats(now=t, queues=queues, workers=[_worker_info(w) for w in workers])

    # -- pausing queues -----------------------------------------------------------------
    def pause_queue(self, queue: str, *, now: float | None = None) -> bool:
        check_queue_name(queue)
        with self._tx() as conn:
            row = conn.execute(Q["pause_queue"], {"queue": queue, "now": now}).fetchone()
        return row is not None

    def resume_queue(self, queue: str, *, now: float | None = None) -> bool:
        check_queue_name(queue)
        with self._tx() as conn:
            changed = conn.execute(Q["resume_queue"], {"queue": queue}).fetchone() is not None
            if changed:
                notify(conn, [queue])  # idle workers look again, as after an enqueue
        return changed

    def paused_queues(self) -> dict[str, float]:
        with self._tx() as conn:
            rows = conn.execute(Q["paused_queues"]).fetchall()
        return {r["queue"]: r["paused_at"] for r in rows}

    def redrive(self, job_ids: Sequence[int] | None = None, *, queue: str | None = None,
                now: float | None = None) -> int:
        check_filters(queue=queue)
        with self._tx() as conn:
            back: list[dict[str, Any]] = []
            if job_ids is None:
                back += conn.execute(Q["redrive_all"], {"now": now, "queue": queue}).fetchall()
                keyed = conn.execute(Q["dead_with_unique_key"], {"queue": queue}).fetchall()
                ids = [r["id"] for r in keyed]
            else:
                ids = list(job_ids)
            for i in ids:
                row = conn.execute(Q["redrive"], {"now": now, "id": i}).fetchone()
                if row:
                    back.append(row)
            if back:
                # Back in the queue as new jobs: fresh fair tags, in id order.
                back.sort(key=lambda r: r["id"])
                with conn.cursor() as cur:
                    run_plan(cur, retag_plan(back))
            notify(conn, [r["queue"] for r in back])
        return len(back)

    def purge(self, *, state: JobState = JobState.DEAD, queue: str | None = None,
              job_ids: Sequence[int] | None = None) -> int:
        state = JobState(state)
        if not state.is_final:
            raise ValueError(f"purge only deletes finished jobs, not {state}")
        check_filters(queue=queue)
        with self._tx() as conn:
            row = conn.execute(
                Q["purge"], {"state": str(state), "queue": queue,
                             "ids": list(job_ids) if job_ids is not None else None}
            ).fetchone()
            assert row is not None
            forget_batches(conn, row["batches"])
            return int(row["n"])

    def cancel(self, job_id: int, *, now: float | None = None) -> bool:
        with self._tx() as conn:
            row = conn.execute(Q["cancel"], {"id": job_id, "now": now}).fetchone()
            if row is not None and row["was"] == "running":
                notify_freed(conn, [row])
        return row is not None

    def cancel_many(self, job_ids: Sequence[int], *, now: float | None = None) -> list[int]:
        ids = sorted({int(i) for i in job_ids})
        if not ids:
            return []
        with self._tx() as conn:
            rows = conn.execute(Q["cancel_many"], {"ids": ids, "now": now}).fetchall()
            notify_freed(conn, [r for r in rows if r["was"] == "running"])
        return sorted(r["id"] for r in rows)


def _worker_info(row: dict[str, Any]) -> WorkerInfo:
    return WorkerInfo(id=row["id"], queues=list(row["queues"]), concurrency=row["concurrency"],
                      host=row["host"], pid=row["pid"], started_at=row["started_at"],
                      last_seen=row["last_seen"], running=row["running"], stuck=row["stuck"])
