"""What SQLite's write transactions do on their open connection: enqueue (with unique keys and
depth limits), claim (with concurrency and rate limits), ack, fair tags, and rows into jobs."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from ...errors import InvalidName
from ...job import Job, JobState, make_job
from ...payload import NAME_RE
from ..base import (
    CLAIM_SCAN,
    EnqueueResult,
    Lease,
    NewBatch,
    NewJob,
    depth_limits,
    new_uids,
    refuse_overflow,
)
from .connection import Q
from .flow import Settled, enqueue_flow, has_flow, settle


def _check_depth(conn: sqlite3.Connection, jobs: Sequence[NewJob],
                 results: Sequence[EnqueueResult]) -> None:
    for queue, limit in sorted(depth_limits(jobs).items()):
        depth = conn.execute(Q["depth"], {"queue": queue}).fetchone()[0]
        refuse_overflow(queue, limit, depth, jobs, results)


def enqueue_in(conn: sqlite3.Connection, jobs: Sequence[NewJob], t: float,
               batches: Sequence[NewBatch] = ()) -> list[EnqueueResult]:
    """Write the batch in the caller's open transaction (which rolls it all back on QueueFull)."""
    results: list[EnqueueResult] = []
    tags = FairTags(conn)
    if has_flow(jobs, batches):
        results = enqueue_flow(conn, jobs, batches, t, _insert_values, tags)
        tags.save()
        _check_depth(conn, jobs, results)
        return results
    uids = new_uids(len(jobs))
    if all(job.unique_key is None for job in jobs):
        rows = [_insert_values(job, t, tags.take(job.queue, job.priority, job.fair_key), uid)
                for job, uid in zip(jobs, uids, strict=True)]
        conn.executemany(Q["insert"], rows)
        # One writer holds the lock and ids are AUTOINCREMENT: the batch is consecutive.
        last = conn.execute("SELECT last_insert_rowid()").fetchone()[0]
        first = last - len(rows) + 1
        results = [EnqueueResult(first + i, True, t, uid) for i, uid in enumerate(uids)]
    else:
        for job, uid in zip(jobs, uids, strict=True):
            if job.unique_key is None:
                tag = tags.take(job.queue, job.priority, job.fair_key)
                cur = conn.execute(Q["insert"], _insert_values(job, t, tag, uid))
                assert cur.lastrowid is not None
                results.append(EnqueueResult(cur.lastrowid, True, t, uid))
                continue
            done = conn.execute(
                Q["unique_done"], {"unique_key": job.unique_key, "now": t}).fetchone()
            if done is not None:
                results.append(EnqueueResult(done[0], False, t))
                continue
            values = _insert_values(job, t, tags.peek(job.queue, job.priority, job.fair_key), uid)
            row = conn.execute(Q["insert_unique"], values).fetchone()
            if row is not None:
                tags.take(job.queue, job.priority, job.fair_key)
                results.append(EnqueueResult(row[0], True, t, uid))
            else:
                existing = conn.execute(Q["find_unique"], {"unique_key": job.unique_key}).fetchone()
                results.append(EnqueueResult(existing[0], False, t))
    tags.save()
    _check_depth(conn, jobs, results)
    return results


def claim_in(conn: sqlite3.Connection, t: float, queue: str, limit: int, worker_id: str,
              lease_s: float, start: int | None, claim_id: str) -> list[Job]:
    conn.execute(Q["promote_queue"], {"queue": queue, "now": t, "limit": 1000})
    params = {"queue": queue, "limit": limit, "now": t, "worker_id": worker_id, "lease_s": lease_s,
              "claim_id": claim_id}
    # Fast path: claim the head of the queue; if limits apply to any of it, undo that and pick
    # job by job.
    conn.execute("SAVEPOINT claim")
    rows = conn.execute(Q["claim"], params).fetchall()
    if any(r["concurrency_key"] is not None or r["rate_key"] is not None for r in rows):
        conn.execute("ROLLBACK TO claim")
        rows = _claim_limited(conn, params)
    conn.execute("RELEASE claim")
    raise_vtime(conn, queue, rows)
    rows.sort(key=lambda r: (r["priority"], r["fair_tag"], r["run_at"], r["id"]))
    if start is not None and start < len(rows):
        conn.execute(Q["hold"], {"ids": json.dumps([r["id"] for r in rows[max(start, 0):]])})
    return [row_to_job(r) for r in rows]


def ack_in(conn: sqlite3.Connection, t: float, acks: Sequence[tuple[Lease, str | None]],
           settled: Settled) -> list[bool]:
    """Ack each lease; the children of the acked jobs that have some are settled in the same
    transaction (into ``settled``)."""
    held: list[bool] = []
    parents: list[tuple[int, str]] = []
    for lease, result in acks:
        row = conn.execute(Q["ack"], {"id": lease.job_id, "token": lease.token, "now": t,
                                      "result": result}).fetchone()
        held.append(row is not None)
        if row is not None and row[0]:
            parents.append((lease.job_id, "succeeded"))
    if parents:
        settle(conn, t, parents, settled)
    return held


def _claim_limited(conn: sqlite3.Connection, params: dict[str, Any]) -> list[sqlite3.Row]:
    """Claim in queue order, passing over jobs whose concurrency or rate limit is reached."""
    limit, t = params["limit"], params["now"]
    running: dict[str, int] = {}
    recent: dict[tuple[str, float], int] = {}
    chosen: list[sqlite3.Row] = []
    seen, page = 0, limit
    while len(chosen) < limit and seen < CLAIM_SCAN:
        batch = conn.execute(Q["claim_candidates"], {
            "queue": params["queue"], "limit": min(page, CLAIM_SCAN - seen), "offset": seen,
        }).fetchall()
        seen += len(batch)
        for row in batch:
            if len(chosen) >= limit:
                break
            ckey, rkey = row["concurrency_key"], row["rate_key"]
            if ckey is not None:
                if ckey not in running:
                    running[ckey] = conn.execute(Q["running_with_key"], {"key": ckey}).fetchone()[0]
                if running[ckey] >= row["concurrency_limit"]:
                    continue
            if rkey is not None:
                window = (rkey, row["rate_period"])
                if window not in recent:
                    recent[window] = conn.execute(
                        Q["rate_claims"], {"key": rkey, "since": t - row["rate_period"]},
                    ).fetchone()[0]
                    recent[window] += sum(1 for c in chosen if c["rate_key"] == rkey)
                if recent[window] >= row["rate_limit"]:
                    continue
                for w in recent:
                    if w[0] == rkey:
                        recent[w] += 1
            if ckey is not None:
                running[ckey] += 1
            chosen.append(row)
        if len(batch) < page:
            break
        page = max(page, 200)  # past the head, look further in bigger steps
    if not chosen:
        return []
    ids = json.dumps([r["id"] for r in chosen])
    rows = conn.execute(Q["claim_ids"], {**params, "ids": ids}).fetchall()
    conn.executemany(Q["add_rate_claim"], [
        {"key": r["rate_key"], "now": t, "expires_at": t + r["rate_period"], "id": r["id"]}
        for r in rows if r["rate_key"] is not None
    ])
    return rows


def raise_vtime(conn: sqlite3.Connection, queue: str, rows: Sequence[sqlite3.Row]) -> None:
    top: dict[int, int] = {}
    for r in rows:
        top[r["priority"]] = max(top.get(r["priority"], 0), r["fair_tag"])
    conn.executemany(Q["raise_vtime"], [{"queue": queue, "priority": p, "vtime": v}
                                        for p, v in top.items()])


class FairTags:
    """Fair tags for one transaction (start-time fair queuing per (queue, priority), see
    backends/base.py): for new jobs at enqueue and for dead jobs coming back by redrive."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._vtime: dict[tuple[str, int], int] = {}
        self._last: dict[tuple[str, int, str], int] = {}
        self._dirty: set[tuple[str, int, str]] = set()

    def _vt(self, queue: str, priority: int) -> int:
        if (queue, priority) not in self._vtime:
            row = self._conn.execute(Q["vtime"], {"queue": queue, "priority": priority}).fetchone()
            self._vtime[(queue, priority)] = row[0] if row else 0
        return self._vtime[(queue, priority)]

    def peek(self, queue: str, priority: int, fair_key: str | None) -> int:
        if fair_key is None:
            return self._vt(queue, priority) + 1
        key = (queue, priority, fair_key)
        if key not in self._last:
            row = self._conn.execute(
                Q["last_tag"], {"queue": queue, "priority": priority, "fair_key": fair_key},
            ).fetchone()
            self._last[key] = row[0] if row else 0
        return max(self._last[key], self._vt(queue, priority)) + 1

    def take(self, queue: str, priority: int, fair_key: str | None) -> int:
        tag = self.peek(queue, priority, fair_key)
        if fair_key is not None:
            self._last[(queue, priority, fair_key)] = tag
            self._dirty.add((queue, priority, fair_key))
        return tag

    def save(self) -> None:
        self._conn.executemany(Q["set_last_tag"], [
            {"queue": q, "priority": p, "fair_key": k, "last_tag": self._last[(q, p, k)]}
            for q, p, k in sorted(self._dirty)
        ])

    def retag(self, rows: Sequence[sqlite3.Row]) -> None:
        """Jobs back from the dead-letter queue join the current round, as new jobs do."""
        self._conn.executemany(Q["set_fair_tag"], [
            {"id": r["id"], "fair_tag": self.take(r["queue"], r["priority"], r["fair_key"])}
            for r in rows
        ])
        self.save()


def step_path(step: str) -> str:
    if not isinstance(step, str) or not NAME_RE.fullmatch(step):
        raise InvalidName(f"step name must match {NAME_RE.pattern}, got {step!r}")
    return f'$."{step}"'


def _insert_values(job: NewJob, t: float, fair_tag: int, uid: str) -> tuple[Any, ...]:
    """The values of the insert statements, in their order."""
    run_at = job.run_at if job.run_at is not None else t + max(job.delay, 0.0)
    return (
        job.queue, job.task, job.args, "scheduled" if run_at > t else "available",
        job.priority, run_at, job.max_attempts, job.timeout, job.unique_key, job.meta, t,
        job.fair_key, fair_tag, job.unique_for, job.concurrency_key, job.concurrency_limit,
        job.rate_key, job.rate_limit, job.rate_period, uid,
    )


def row_to_job(row: sqlite3.Row) -> Job:
    return make_job(
        id=row["id"], task=row["task"], queue=row["queue"], args=json.loads(row["args"]),
        state=JobState(row["state"]), attempts=row["attempt"], max_attempts=row["max_attempts"],
        priority=row["priority"], run_at=row["run_at"], timeout=row["timeout_s"],
        created_at=row["created_at"], uid=row["uid"], attempted_at=row["attempted_at"],
        finished_at=row["finished_at"],
        result=json.loads(row["result"]) if row["result"] is not None else None,
        errors=json.loads(row["errors"]), unique_key=row["unique_key"], worker_id=row["worker_id"],
        lease_token=row["lease_token"], lease_expires_at=row["lease_expires_at"],
        meta=json.loads(row["meta"]),
        fair_key=row["fair_key"], steps=json.loads(row["steps"]),
        concurrency_key=row["concurrency_key"], concurrency_limit=row["concurrency_limit"],
        rate_key=row["rate_key"], rate_limit=row["rate_limit"], rate_period=row["rate_period"],
        stalls=row["stalls"],
        parents=tuple(json.loads(row["parents"])) if row["parents"] is not None else (),
        on_parent_failure=row["on_parent_failure"], batch_id=row["batch_id"],
        callback_of=row["callback_of"],
    )

