"""What the stores' implementations share: claim ids, job uids, filter and lock-name checks,
queue depth limits, and per-queue stats from SQL rows."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import PayloadError, QueueFull
from .types import EnqueueResult, NewJob, QueueStats

CLAIM_ID_RE = re.compile(r"[0-9a-f]{24}")
LOCK_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def check_claim_id(claim_id: str) -> str:
    """A claim id is 24 lowercase hex digits (96 random bits): the first part of every lease
    token the claim hands out, so a claimer whose reply was lost can name the claim's leases."""
    if not isinstance(claim_id, str) or not CLAIM_ID_RE.fullmatch(claim_id):
        raise ValueError(f"a claim id is 24 lowercase hex digits, got {claim_id!r}")
    return claim_id


def new_claim_id() -> str:
    return os.urandom(12).hex()


def new_uids(n: int) -> list[str]:
    """``n`` job uids of 32 hex digits (128 random bits each) from one read of the OS's random
    source. Random, not counted: a store that lost data and counts its ids again from an older
    value still never repeats one."""
    raw = new_uid_text(n)
    return [raw[i:i + 32] for i in range(0, 32 * n, 32)]


def new_uid_text(n: int) -> str:
    """The ``n`` uids of new_uids as one text, one after the other (the Redis enqueue script
    takes them so: one argument, not one per job)."""
    return os.urandom(16 * n).hex()


def check_lock_name(name: str) -> str:
    """A lock name goes into a file name or a key: keep it to a safe alphabet."""
    if not LOCK_NAME_RE.fullmatch(name):
        raise ValueError(f"a lock name is 1-64 characters from A-Z a-z 0-9 _ . -, got {name!r}")
    return name


def check_filters(**filters: str | None) -> None:
    """Refuse filter values a store cannot even encode (a lone surrogate, as a non-UTF-8 byte
    in argv becomes) with PayloadError rather than a driver's UnicodeEncodeError."""
    for name, value in filters.items():
        if value is None:
            continue
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise PayloadError(
                f"{name} filter {value!r} is not valid text (lone surrogate)") from None


def queue_full(queue: str, depth: int, limit: int) -> QueueFull:
    return QueueFull(
        f"queue {queue!r} is full: {depth} job(s) waiting, max_depth is {limit}; "
        "nothing was enqueued",
        queue=queue, depth=depth, limit=limit,
    )


def depth_limits(jobs: Sequence[NewJob]) -> dict[str, int]:
    """The max_depth of each queue a batch writes to, for queues that have one."""
    return {j.queue: j.max_depth for j in jobs if j.max_depth is not None}


def refuse_overflow(queue: str, limit: int, depth_after: int, jobs: Sequence[NewJob],
                    results: Sequence[EnqueueResult]) -> None:
    """Raise QueueFull if the batch, already written in the caller's open transaction, took
    ``queue`` past ``limit``; the caller's rollback then undoes the whole batch."""
    if depth_after > limit:
        added = sum(1 for j, r in zip(jobs, results, strict=True)
                    if r.created and j.queue == queue)
        raise queue_full(queue, depth_after - added, limit)


def queue_stats_from_rows(
    now: float,
    counts: Iterable[Mapping[str, Any]],
    due: Iterable[Mapping[str, Any]],
    oldest: Iterable[Mapping[str, Any]],
    counters: Iterable[Mapping[str, Any]],
    expired: Iterable[Mapping[str, Any]] = (),
    paused: Mapping[str, float] | None = None,
) -> list[QueueStats]:
    """Assemble per-queue stats from the SQL stores' rows: counts (queue, state, n), due
    scheduled jobs (queue, n, oldest), oldest available (queue, oldest), counters
    (queue, name, value) and running jobs past their lease (queue, n). Due scheduled jobs
    count as available: they are waiting too."""
    per: dict[str, dict[str, Any]] = {}

    def q(name: str) -> dict[str, Any]:
        return per.setdefault(name, {"queue": name})

    for row in counts:
        q(row["queue"])[row["state"]] = row["n"]
    for row in due:
        entry = q(row["queue"])
        entry["scheduled"] = entry.get("scheduled", 0) - row["n"]
        entry["available"] = entry.get("available", 0) + row["n"]
        entry["_oldest"] = row["oldest"]
    for row in oldest:
        entry = q(row["queue"])
        prev = entry.get("_oldest")
        entry["_oldest"] = row["oldest"] if prev is None else min(prev, row["oldest"])
    for row in counters:
        if row["name"] == "lease_expired":
            q(row["queue"])["lease_expiries"] = row["value"]
    for row in expired:
        q(row["queue"])["expired_leases"] = row["n"]
    for name, since in (paused or {}).items():
        q(name).update(paused=True, paused_since=since)  # listed even with no job
    queues = []
    for name in sorted(per):
        entry = per[name]
        oldest_at = entry.pop("_oldest", None)
        entry["oldest_available_age"] = (
            max(0.0, now - oldest_at) if oldest_at is not None else None)
        queues.append(QueueStats(**entry))
    return queues
