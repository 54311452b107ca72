"""A worker's claims on PostgreSQL: the fast path, the limited path, and a claim whose reply
was lost.

The fast path is one statement (ack_claim: the worker's acks, then ``FOR NO KEY UPDATE SKIP
LOCKED``), batched to the worker's free slots. It claims nothing if any job it picked has a
concurrency or rate limit (backends/base.py), and then a second transaction takes the limited
path. That path reads the waiting jobs in claim order without locking them (at most
``CLAIM_SCAN``), takes a transaction-scoped advisory lock per limit key with
``pg_try_advisory_xact_lock`` (a key another claimer holds is passed over this round: nobody
waits, so nobody deadlocks), counts running jobs and recent claims per key in the next statement
(READ COMMITTED: it sees the previous holder's commit), and claims the admitted jobs with ``SKIP
LOCKED``, recording a ``conveyor_rate_claims`` row per claim of a rate-limited job in the same
statement. A queue whose head was limited keeps taking the limited path until a claim there
finds no limited job among those it looked at.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import psycopg

from ...errors import StoreError
from ...job import Job
from ..base import CLAIM_SCAN, Lease, check_claim_id, new_claim_id
from .connection import Conn, PooledBackend, translate
from .queries import Q, ack_claim_sql, claimed_jobs, notify, notify_freed

log = logging.getLogger("conveyor.postgres")

RECOVER_S = 2.0  # how long a claimer whose reply was lost keeps trying to give the claim back
CLAIM_PAGE = 200  # jobs per page of the limited walk after the first
PROMOTE_AT_ONCE = 1000  # due jobs of the queue a claim promotes first, at most


class Claiming(PooledBackend):
    """The claims of PostgresBackend."""

    # Queues whose last claim met limited jobs at their head: their claims go straight to the
    # limited path instead of trying the fast statement first (a hint, never a rule).
    _limited_queues: set[str]

    def claim(
        self, queue: str, limit: int, *, worker_id: str, lease_s: float, now: float | None = None,
        start: int | None = None, claim_id: str | None = None,
    ) -> list[Job]:
        claim_id = new_claim_id() if claim_id is None else check_claim_id(claim_id)
        if limit <= 0:
            return []
        return self._ack_and_claim([], queue, limit, worker_id, lease_s, now, start, claim_id)[1]

    def ack_and_claim(
        self, acks: Sequence[tuple[Lease, str | None]], queue: str, limit: int, *,
        worker_id: str, lease_s: float, now: float | None = None, start: int | None = None,
    ) -> tuple[list[bool], list[Job]]:
        return self._ack_and_claim(acks, queue, limit, worker_id, lease_s, now, start,
                                   new_claim_id())

    def release_claim(self, queue: str, claim_id: str, *, now: float | None = None) -> list[int]:
        check_claim_id(claim_id)
        with self._tx(control=True) as conn:
            rows = conn.execute(Q["release_claim"],
                                {"queue": queue, "claim_id": claim_id}).fetchall()
            notify(conn, [r["queue"] for r in rows])
        return sorted(r["id"] for r in rows)

    def _ack_and_claim(
        self, acks: Sequence[tuple[Lease, str | None]], queue: str, limit: int, worker_id: str,
        lease_s: float, now: float | None, start: int | None, claim_id: str,
    ) -> tuple[list[bool], list[Job]]:
        """A claim whose reply is lost (the connection broke after it was sent) is given back
        by its claim id (release_claim) once the store answers again, so its jobs are not
        charged an attempt for it; if that fails too, they are held and come back as stalls."""
        try:
            return self._ack_and_claim_once(acks, queue, limit, worker_id, lease_s, now, start,
                                            claim_id)
        except StoreError:
            # A broken connection comes as StoreError or StoreUnavailable; either way the claim
            # may have committed unseen. Giving back a claim that never ran finds nothing.
            self._give_back_lost_claim(queue, claim_id, now)
            raise

    def _give_back_lost_claim(self, queue: str, claim_id: str, now: float | None) -> None:
        """release_claim, tried again for up to RECOVER_S while the store is away (the blip
        that lost the reply often takes the next connection too); after that the jobs come
        back when their leases run out, as held jobs, uncounted (see reap)."""
        deadline = time.monotonic() + RECOVER_S
        pause = 0.05
        while True:
            try:
                released = self.release_claim(queue, claim_id, now=now)
            except StoreError:
                if time.monotonic() + pause > deadline:
                    log.warning("a claim's reply was lost and its jobs could not be given back; "
                                "they come back when their leases run out")
                    return
                time.sleep(pause)
                pause = min(pause * 2, 0.5)
                continue
            if released:
                log.warning("a claim's reply was lost: gave its jobs back unrun: %s", released)
            return

    def _ack_and_claim_once(
        self, acks: Sequence[tuple[Lease, str | None]], queue: str, limit: int, worker_id: str,
        lease_s: float, now: float | None, start: int | None, claim_id: str,
    ) -> tuple[list[bool], list[Job]]:
        """The queue's due jobs promoted (a statement of its own, so the claim sees them in
        their place in claim order), then the acks and the claim in one statement, both in
        autocommit: two round trips and no BEGIN/COMMIT. If a limit applies at the head of
        the queue, it claims nothing and the limited path (a transaction) does."""
        if limit <= 0:
            return (self.ack_many(acks, now=now) if acks else []), []
        params = {"queue": queue, "now": now, "worker_id": worker_id, "lease_s": lease_s,
                  "claim_id": claim_id, "start": limit if start is None else max(start, 0)}
        promote = {"queue": queue, "now": now, "limit": PROMOTE_AT_ONCE}
        held: list[bool] = []
        jobs: list[Job] = []
        for _ in range(2):
            if queue in self._limited_queues:
                if acks:
                    held = self.ack_many(acks, now=now)
                return held, jobs + self._claim_limited_path(queue, limit - len(jobs), params)
            want = limit - len(jobs)
            args = {**params, "limit": want, "ids": [x.job_id for x, _ in acks],
                    "tokens": [x.token for x, _ in acks], "results": [r for _, r in acks]}
            try:
                with self._live_connection(self._control) as conn:
                    conn.execute(Q["promote_queue"], promote)
                    rows = conn.execute(ack_claim_sql(want), args).fetchall()
                    freed = [r for r in rows[0]["acked"] if r["concurrency_key"] is not None]
                    if freed:
                        with conn.transaction():
                            notify_freed(conn, freed)
            except psycopg.Error as exc:
                raise translate(exc) from exc
            if acks:
                held_ids = {r["id"] for r in rows[0]["acked"]}
                held = [lease.job_id in held_ids for lease, _ in acks]
                acks = []
            if rows[0]["head_limited"]:
                self._limited_queues.add(queue)  # nothing was claimed: the limited path next
                continue
            jobs += claimed_jobs([r for r in rows if r["id"] is not None])
            break
        return held, jobs

    def _claim_limited_path(self, queue: str, limit: int, params: dict[str, Any]) -> list[Job]:
        with self._tx(control=True) as conn:
            conn.execute(Q["promote_queue"],
                         {"queue": queue, "now": params["now"], "limit": PROMOTE_AT_ONCE})
            rows, saw_limited = _claim_limited(conn, {**params, "limit": limit})
        if not saw_limited:
            self._limited_queues.discard(queue)  # no limits at the head any more: fast path again
        return claimed_jobs(rows)


# -- the limited claim ----------------------------------------------------------------------------

class _Limits:
    """What one limited claim knows of each limit key: whether it holds the key's lock, running
    jobs per concurrency key and claims per (rate key, period) window, each plus the jobs this
    claim admitted so far."""

    def __init__(self, conn: Conn, now: float | None) -> None:
        self._conn = conn
        self._now = now
        self.locked: set[tuple[str, str]] = set()  # ("c" | "r", key)
        self.busy: set[tuple[str, str]] = set()  # another claimer holds the lock: pass over
        self.running: dict[str, int] = {}
        self.recent: dict[tuple[str, float], int] = {}

    @staticmethod
    def keys_of(row: dict[str, Any]) -> list[tuple[str, str]]:
        keys = []
        if row["concurrency_key"] is not None:
            keys.append(("c", row["concurrency_key"]))
        if row["rate_key"] is not None:
            keys.append(("r", row["rate_key"]))
        return keys

    def known(self, row: dict[str, Any]) -> bool:
        """Whether every limit of ``row`` is decided (locked and counted, or busy)."""
        for kind, key in self.keys_of(row):
            if (kind, key) in self.busy:
                continue
            if (kind, key) not in self.locked:
                return False
            if kind == "c" and key not in self.running:
                return False
            if kind == "r" and (key, row["rate_period"]) not in self.recent:
                return False
        return True

    def blocked(self, row: dict[str, Any]) -> bool:
        """Whether what is known already holds ``row`` back (undecided limits do not)."""
        ckey, rkey = row["concurrency_key"], row["rate_key"]
        if ckey is not None and (("c", ckey) in self.busy
                                 or self.running.get(ckey, 0) >= row["concurrency_limit"]):
            return True
        return rkey is not None and (
            ("r", rkey) in self.busy
            or self.recent.get((rkey, row["rate_period"]), 0) >= row["rate_limit"])

    def decide(self, rows: Sequence[dict[str, Any]], chosen: Sequence[dict[str, Any]]) -> None:
        """Lock and count the undecided limits of ``rows``: two statements, in that order."""
        to_lock = sorted({k for r in rows for k in self.keys_of(r)} - self.locked - self.busy)
        if to_lock:
            got = self._conn.execute(Q["limit_locks"], {
                "kinds": [kind for kind, _ in to_lock],
                "keys": [key for _, key in to_lock]}).fetchall()
            for r in got:
                (self.locked if r["locked"] else self.busy).add((r["kind"], r["key"]))
        ckeys = sorted({r["concurrency_key"] for r in rows
                        if r["concurrency_key"] is not None
                        and ("c", r["concurrency_key"]) in self.locked
                        and r["concurrency_key"] not in self.running})
        windows = sorted({(r["rate_key"], float(r["rate_period"])) for r in rows
                          if r["rate_key"] is not None
                          and ("r", r["rate_key"]) in self.locked
                          and (r["rate_key"], r["rate_period"]) not in self.recent})
        if not ckeys and not windows:
            return
        counts = self._conn.execute(Q["limit_counts"], {
            "ckeys": ckeys, "rkeys": [k for k, _ in windows], "periods": [p for _, p in windows],
            "now": self._now}).fetchall()
        for r in counts:
            if r["kind"] == "c":
                # Jobs admitted by this claim are not running yet: none has this key (it was
                # undecided until now), so the count stands as read.
                self.running[r["key"]] = r["n"]
            else:
                window = (r["key"], r["period"])
                self.recent[window] = r["n"] + sum(1 for c in chosen if c["rate_key"] == r["key"])

    def admit(self, row: dict[str, Any]) -> bool:
        if self.blocked(row):
            return False
        if row["rate_key"] is not None:
            for window in self.recent:
                if window[0] == row["rate_key"]:
                    self.recent[window] += 1
        if row["concurrency_key"] is not None:
            self.running[row["concurrency_key"]] += 1
        return True


def _claim_limited(conn: Conn, params: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """Claim in queue order, passing over jobs whose concurrency or rate limit is reached, or
    whose key another claimer is deciding right now; at most CLAIM_SCAN jobs looked at. Returns
    the claimed rows and whether any job looked at had a limit."""
    limit: int = params["limit"]
    limits = _Limits(conn, params["now"])
    chosen: list[dict[str, Any]] = []
    saw_limited = False
    seen = 0
    page = min(max(limit * 4, 50), CLAIM_SCAN)
    last: dict[str, Any] | None = None
    while len(chosen) < limit and seen < CLAIM_SCAN:
        want = min(page, CLAIM_SCAN - seen)
        if last is None:
            batch = conn.execute(Q["claim_candidates"],
                                 {"queue": params["queue"], "limit": want}).fetchall()
        else:
            batch = conn.execute(Q["claim_candidates_after"], {
                "queue": params["queue"], "limit": want, "priority": last["priority"],
                "fair_tag": last["fair_tag"], "run_at": last["run_at"],
                "id": last["id"]}).fetchall()
        seen += len(batch)
        for i, row in enumerate(batch):
            if len(chosen) >= limit:
                break
            if row["concurrency_key"] is None and row["rate_key"] is None:
                chosen.append(row)
                continue
            saw_limited = True
            if not limits.known(row):
                # Decide this job's keys and those of the jobs after it that could still be
                # admitted, as many as the slots left: one lock and one count statement for
                # all of them, without locking keys this claim will not get to.
                ahead: list[dict[str, Any]] = []
                for nxt in batch[i:]:
                    if len(ahead) >= limit - len(chosen):
                        break
                    if not limits.blocked(nxt):
                        ahead.append(nxt)
                limits.decide([r for r in ahead if not limits.known(r)], chosen)
            if limits.admit(row):
                chosen.append(row)
        if len(batch) < want:
            break
        last = batch[-1]
        page = CLAIM_PAGE
    if not chosen:
        return [], saw_limited
    held_ids = [r["id"] for r in chosen[params["start"]:]]  # claim order: the first `start` start
    rows = conn.execute(Q["claim_ids"], {**params, "ids": [r["id"] for r in chosen],
                                         "held_ids": held_ids}).fetchall()
    return rows, saw_limited
