"""Workflows on SQLite (backends/base.py, "Dependencies"): jobs written with parents or in
batches, children settled when a parent finishes, batch counts, and what prune leaves behind.

Everything here runs inside the caller's write transaction, as explicit statements: the
transitions that finish a job return its ``has_children`` flag, and only a job whose flag is set
costs a statement more."""

from __future__ import annotations

import json
import sqlite3
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...errors import UnknownParent
from ...job import JobState
from ..base import BatchInfo, EnqueueResult, NewBatch, NewJob, new_uids
from .connection import Q

if TYPE_CHECKING:
    from .writes import FairTags

_UNFINISHED = ("waiting", "scheduled", "available", "running")
_FAILED = ("dead", "cancelled")


def has_flow(jobs: Sequence[NewJob], batches: Sequence[NewBatch]) -> bool:
    return bool(batches) or any(
        j.after or j.after_refs or j.batch_id or j.callback_of for j in jobs)


@dataclass
class Settled:
    """What settling children did, for the wake-ups after the commit."""

    ready: bool = False  # a child became available: idle workers should look
    finished: list[int] = field(default_factory=list)  # children cancelled by the cascade


def settle(conn: sqlite3.Connection, t: float, parents: Iterable[tuple[int, str]],
           into: Settled | None = None) -> Settled:
    """Settle the waiting children of jobs that just reached a final state: ``parents`` holds
    (id, final state) of finished jobs whose has_children flag is set. A cancelled child's own
    children are settled in turn, from a queue (a long chain is a loop, not a recursion)."""
    out = Settled() if into is None else into
    todo = deque(parents)
    while todo:
        parent, state = todo.popleft()
        children = [r[0] for r in conn.execute(Q["settle_edges"], {"parent": parent})]
        if not children:
            continue
        kids = json.dumps(children)
        if state in _FAILED:
            gone = conn.execute(Q["settle_cancel"], {
                "children": kids, "now": t, "message": _failed_message(parent, state),
            }).fetchall()
            for row in gone:
                out.finished.append(row["id"])
                if row["has_children"]:
                    todo.append((row["id"], JobState.CANCELLED.value))
        rows = conn.execute(Q["settle_done"], {"children": kids, "now": t}).fetchall()
        out.ready = out.ready or any(r["state"] == "available" for r in rows)
    return out


def _failed_message(parent: int, state: str) -> str:
    how = "went dead" if state == "dead" else "was cancelled"
    return f"job {parent}, which this job was enqueued after, {how}"


def _parent_failed_errors(parent: int, state: str, t: float) -> str:
    return json.dumps([{
        "attempt": 0, "at": t, "kind": "parent_failed", "type": "ParentFailed",
        "message": _failed_message(parent, state), "traceback": "", "worker_id": None,
    }])


def _check_refs(jobs: Sequence[NewJob]) -> None:
    """A reference to the job itself or a later one could close a cycle: refused before any
    write."""
    for i, job in enumerate(jobs):
        for ref in job.after_refs:
            if not 0 <= ref < i:
                raise UnknownParent(f"after_refs[{ref}]", f"job {i} of the write refers to "
                                    "itself or a later position")


def enqueue_flow(conn: sqlite3.Connection, jobs: Sequence[NewJob], batches: Sequence[NewBatch],
                 t: float, insert_values: Callable[[NewJob, float, int, str], tuple[Any, ...]],
                 tags: FairTags) -> list[EnqueueResult]:
    """Write jobs with parents or batches, one by one (each may name the ones before it), in
    the caller's open transaction: an UnknownParent raised here rolls back all of it."""
    _check_refs(jobs)
    for batch in batches:
        conn.execute(Q["add_batch"], {"id": batch.id, "parent_id": batch.parent_id, "now": t})
    results: list[EnqueueResult] = []
    for job, uid in zip(jobs, new_uids(len(jobs)), strict=True):
        parents = sorted({*job.after, *(results[r].id for r in job.after_refs)})
        states: dict[int, str] = {}
        if parents:
            states = {r[0]: r[1] for r in conn.execute(
                Q["parent_states"], {"ids": json.dumps(parents)})}
            missing = [p for p in parents if p not in states]
            if missing:
                raise UnknownParent(missing[0])
        if job.unique_key is not None:
            done = conn.execute(
                Q["unique_done"], {"unique_key": job.unique_key, "now": t}).fetchone()
            if done is not None:
                results.append(EnqueueResult(done[0], False, t))
                continue
        failed = [p for p in parents if states[p] in _FAILED]
        waiting_on = sum(1 for p in parents if states[p] in _UNFINISHED)
        values = list(insert_values(job, t, tags.peek(job.queue, job.priority, job.fair_key),
                                    uid))
        finished_at, errors = None, "[]"
        if failed and job.on_parent_failure == "cancel":
            values[3], waiting_on = "cancelled", 0
            finished_at, errors = t, _parent_failed_errors(failed[0], states[failed[0]], t)
        elif waiting_on:
            values[3] = "waiting"
        values += [json.dumps(parents) if parents else None, waiting_on, job.on_parent_failure,
                   job.batch_id, job.callback_of, finished_at, errors]
        if job.unique_key is None:
            cur = conn.execute(Q["insert_flow"], values)
            job_id = cur.lastrowid
        else:
            row = conn.execute(Q["insert_flow_unique"], values).fetchone()
            if row is None:
                existing = conn.execute(
                    Q["find_unique"], {"unique_key": job.unique_key}).fetchone()
                results.append(EnqueueResult(existing[0], False, t))
                continue
            job_id = row[0]
        assert job_id is not None
        tags.take(job.queue, job.priority, job.fair_key)
        results.append(EnqueueResult(job_id, True, t, uid))
        _link(conn, job, job_id, parents, states)
    return results


def _link(conn: sqlite3.Connection, job: NewJob, job_id: int, parents: list[int],
          states: dict[int, str]) -> None:
    if parents:
        # An edge from a parent already finished is settled now: its finish was counted above.
        conn.executemany(Q["add_edge"], [
            (p, job_id, 0 if states[p] in _UNFINISHED else 1) for p in parents])
        conn.execute(Q["mark_parents"], {"ids": json.dumps(parents)})
    if job.batch_id is not None:
        conn.execute(Q["add_batch_member"], (job.batch_id, job_id))
    if job.callback_of is not None:
        which = "set_on_complete" if job.on_parent_failure == "run" else "set_on_success"
        conn.execute(Q[which], {"job_id": job_id, "batch_id": job.callback_of})


def forget(conn: sqlite3.Connection, rows: Sequence[sqlite3.Row]) -> None:
    """Deleted jobs (id, has_children, parents, batch_id): their edges and batch memberships go
    too, and a batch left with no member and no nested batch goes with them."""
    conn.executemany(Q["forget_children"], [(r["id"],) for r in rows if r["has_children"]])
    conn.executemany(Q["forget_parent"], [
        (p, r["id"]) for r in rows if r["parents"] for p in json.loads(r["parents"])])
    members = [(r["batch_id"], r["id"]) for r in rows if r["batch_id"] is not None]
    if not members:
        return
    conn.executemany(Q["forget_member"], members)
    todo = deque(sorted({b for b, _ in members}))
    while todo:
        gone = conn.execute(Q["forget_batch"], {"id": todo.popleft()}).fetchone()
        if gone is not None and gone[0] is not None:
            todo.append(gone[0])


def read_batch(conn: sqlite3.Connection, batch_id: str) -> BatchInfo | None:
    row = conn.execute(Q["batch"], {"id": batch_id}).fetchone()
    if row is None:
        return None
    counts = {r["state"]: r["n"] for r in conn.execute(Q["batch_counts"], {"id": batch_id})}
    return BatchInfo(
        id=row["id"], created_at=row["created_at"], parent_id=row["parent_id"],
        total=sum(counts.values()), waiting=counts.get("waiting", 0),
        pending=sum(counts.get(s, 0) for s in ("scheduled", "available", "running")),
        succeeded=counts.get("succeeded", 0), dead=counts.get("dead", 0),
        cancelled=counts.get("cancelled", 0),
        on_success=row["on_success"], on_complete=row["on_complete"],
    )
