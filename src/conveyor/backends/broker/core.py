"""A Backend on a message broker (RabbitMQ, SQS): the job travels as a message (message.py), the
broker's own lease holds it while a worker runs it, and this class keeps the lifecycle the
other stores keep in their tables.

* Enqueue publishes and returns once the broker confirmed. Ids are made here (63 bits: the
  time in milliseconds and 22 random bits), since a broker counts nothing.
* A claim receives from the queue's lanes, lowest priority level first. Each delivery gets a
  lease token of this process; the broker's lease (the connection, the visibility timeout) is
  the real one. A delivery the broker handed out before (its holder died, froze or lost its
  connection) costs an attempt once it has been handed out ``MAX_STALLS`` times more than its
  attempts (the broker counts hand-outs, not starts); past ``max_attempts`` it goes to the dead
  lane at once, as a reaped job goes dead. A claim returns only deliveries the transport still
  holds when it ends, and one that raises gives back what it received.
* Ack, retry, kill and release check the token, then settle the delivery with the broker. A
  holder whose delivery the broker took back (a zombie) is told ``LeaseLost`` and records
  nothing: the settle is refused by the broker itself (a dead channel's tags, an outdated
  receipt handle).
* A retry publishes the job again with the failure recorded and a delay, then settles the old
  delivery; kill publishes it to the dead lane. Publish first: a crash in between runs the
  job twice (at-least-once), never zero times.

What a broker cannot answer (a job by id, listings other than the dead lane, results, steps,
unique keys, cron ticks, limits, pauses, dependencies, history) raises
:class:`~conveyor.errors.Unsupported` naming the capability; ``MISSING`` lists them and
docs/backends.md has the table. A transport that adds a capability says so
(``Transport.supports``: SQS FIFO deduplicates unique keys and groups by fair_key), and the
backend's ``missing`` leaves it out.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from ...errors import ConfigurationError, LeaseLost, Unsupported
from ...job import Job, JobState
from ..base import (
    Backend,
    BatchInfo,
    HistoryPoint,
    check_claim_id,
    new_claim_id,
    new_uids,
    queue_full,
)
from ..types import (
    CronState,
    EnqueueResult,
    ErrorInfo,
    Lease,
    NewBatch,
    NewJob,
    Page,
    QueueStats,
    ReapResult,
    Stats,
    WorkerInfo,
)
from .message import BadMessage, Body, decode
from .transport import Delivery, Lane, Outgoing, Transport

log = logging.getLogger("conveyor.broker")

# What a store on a broker alone cannot do (Backend.missing); the hint says where it can.
MISSING = frozenset({
    "lookup", "listing", "results", "steps", "unique", "cron", "limits", "pause", "dependencies",
    "history", "workers", "cancel", "fair", "clock", "locks", "run_now", "depth",
    "ordering",
})
_WHY = {
    "lookup": "look up a job by id",
    "listing": "list jobs other than the dead ones of one queue",
    "results": "keep results",
    "steps": "record steps (JobContext.once)",
    "unique": "deduplicate by unique_key",
    "cron": "keep cron ticks",
    "limits": "enforce concurrency or rate limits",
    "pause": "pause a queue",
    "dependencies": "run jobs after= others, chains or batches",
    "history": "keep throughput history",
    "workers": "list workers",
    "cancel": "cancel a job by id",
    "fair": "share a queue fairly between fair_key tenants",
    # Never raised: a caller's now= stamps the records, but what is due and which lease ran
    # out is the broker's to say, in real time (the tests that move a clock need a store).
    "clock": "run delays and leases on the caller's clock (now=)",
    # Never raised either: try_lock never refuses (Backend's default), so every worker prunes,
    # which costs nothing here (a broker keeps no finished jobs).
    "locks": "hold a lock shared by every worker (one pruner at a time)",
    "run_now": "make a delayed job due now (the broker holds the delay)",
    # Never raised: max_depth is held to the broker's count (_check_depth), which racing
    # producers pass together and which RabbitMQ's delayed messages are not in.
    "depth": "hold a queue to max_depth exactly",
    # Never raised: a claim takes lane by lane (the nearest priority level), each in the order
    # the broker received its messages, not by (priority, run_at, id).
    "ordering": "hand jobs out in (priority, run_at, id) order",
}
# What the companion store (broker/companion.py) cannot add either: the claim must choose.
NEEDS_A_STORE = frozenset({"limits", "pause", "dependencies", "fair", "clock", "run_now",
                           "ordering"})
HINT_STATE = ("name a companion store that keeps the job records: Conveyor(url, "
              "state='postgresql://...'), $CONVEYOR_STATE_URL or --state-url (docs/backends.md, "
              "the capability table)")
HINT_STORE = ("the broker chooses which job runs, so this needs a SQLite, PostgreSQL or Redis "
              "store instead (docs/backends.md, the capability table)")
EARLY = 0.05  # a delayed message received this close to its run_at runs now
# Hand-outs the broker took back that cost no attempt (then each one does). A broker cannot
# tell a message that ran from one held unstarted (a consumer's prefetch) or lost with a
# connection cut, so the first few go free, as the stores' MAX_STALLS do for held jobs; a job
# that kills every worker still ends (dead), after max_attempts + MAX_STALLS hand-outs.
MAX_STALLS = 3


def unsupported(store: str, capability: str) -> Unsupported:
    hint = HINT_STORE if capability in NEEDS_A_STORE else HINT_STATE
    return Unsupported(_WHY[capability], store, hint)


@dataclass
class _Held:
    delivery: Delivery
    body: Body
    attempt: int
    worker_id: str


class BrokerBackend(Backend):
    missing = MISSING

    def __init__(self, url: str, transport: Transport, levels: Sequence[int] = (0,)) -> None:
        if not levels:
            raise ConfigurationError(f"{url!r}: at least one priority level is needed")
        self.url = url
        self.transport = transport
        self.kind = transport.kind
        self.levels = tuple(sorted(set(levels)))
        self.missing = MISSING - transport.supports
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()
        self._seen: set[str] = set()  # queues this process used (for stats without a listing)
        self._serial = itertools.count(1)

    # -- helpers ------------------------------------------------------------------------
    def _unsupported(self, capability: str) -> Unsupported:
        return unsupported(self.kind, capability)

    def lane(self, queue: str, priority: int) -> Lane:
        """The job lane of ``priority``: the nearest level (the lower one on a tie)."""
        level = min(self.levels, key=lambda lv: (abs(lv - priority), lv))
        return Lane(queue, level)

    def lanes(self, queue: str) -> list[Lane]:
        return [Lane(queue, lv) for lv in self.levels]

    def now(self) -> float:
        # A broker has no clock to read: delays and ages use this machine's.
        return time.time()

    def _token(self, claim_id: str) -> str:
        return f"{claim_id}{next(self._serial):x}"

    def _take(self, lease: Lease, *, pop: bool) -> _Held:
        with self._lock:
            held = self._held.get(lease.token)
            if held is None or held.body.id != lease.job_id:
                raise LeaseLost(lease.job_id)
            if pop:
                del self._held[lease.token]
            return held

    @staticmethod
    def _outgoing(lane: Lane, body: Body, *, delay: float = 0.0,
                  dedup_id: str | None = None) -> Outgoing:
        """The message of ``body`` for ``lane``, in its group (for a broker that groups): the
        job's fair_key in a job lane, so that a tenant's jobs are handed out in order and
        tenants side by side; else the job's own id, so that two copies of one job (a retry
        published while the old delivery is still held) are never out at once, and other jobs
        never wait behind it. Only an enqueue passes a ``dedup_id``: a job published again must
        not be dropped as its own duplicate."""
        group = body.fair_key if body.fair_key is not None and not lane.dead else str(body.id)
        return Outgoing(lane, body.encode(), delay=delay, dedup_id=dedup_id, group=group)

    def _settle(self, lease: Lease, held: _Held) -> None:
        (ok,) = self.transport.settle([held.delivery])
        if not ok:
            raise LeaseLost(lease.job_id, f"{self.kind} took the message back")

    # -- producer -----------------------------------------------------------------------
    def enqueue_many(self, jobs: Sequence[NewJob], *, now: float | None = None,
                     batches: Sequence[NewBatch] = ()) -> list[EnqueueResult]:
        if batches or any(j.after or j.after_refs for j in jobs):
            raise self._unsupported("dependencies")
        for j in jobs:
            if j.unique_key is not None and "unique" in self.missing:
                raise self._unsupported("unique")
            if j.concurrency_key is not None or j.rate_key is not None:
                raise self._unsupported("limits")
            if j.fair_key is not None and "fair" in self.missing:
                raise self._unsupported("fair")
        at = self.now() if now is None else now
        self._check_depth(jobs)
        uids = new_uids(len(jobs))
        out: list[Outgoing] = []
        results = []
        for job, uid in zip(jobs, uids, strict=True):
            run_at = job.run_at if job.run_at is not None else at + max(job.delay, 0.0)
            body = Body(
                id=new_id(), uid=uid, task=job.task, queue=job.queue, args=job.args,
                meta=job.meta, priority=job.priority, max_attempts=job.max_attempts,
                timeout=job.timeout, created_at=at, run_at=run_at,
                state=(JobState.SCHEDULED if run_at > at else JobState.AVAILABLE).value,
                fair_key=job.fair_key, unique_key=job.unique_key,
            )
            # A broker that deduplicates (SQS FIFO) drops a second job of one unique key within
            # its window, yet acknowledges it as sent: created stays True, and that job's id
            # names no job (docs/backends.md). Without a key, the job's own uid: never a match.
            dedup = f"unique:{job.unique_key}" if job.unique_key is not None else f"job:{uid}"
            out.append(self._outgoing(self.lane(job.queue, job.priority), body,
                                      delay=max(run_at - at, 0.0), dedup_id=dedup))
            results.append(EnqueueResult(body.id, True, at, uid))
            self._seen.add(job.queue)
        self.transport.publish(out)
        return results

    def _check_depth(self, jobs: Sequence[NewJob]) -> None:
        """``max_depth`` against the broker's count of ready and delayed messages: a count the
        broker reports, not a lock, so producers racing each other can pass it together."""
        adding: dict[str, int] = {}
        limit: dict[str, int] = {}
        for j in jobs:
            if j.max_depth is not None:
                adding[j.queue] = adding.get(j.queue, 0) + 1
                limit[j.queue] = min(limit.get(j.queue, j.max_depth), j.max_depth)
        for queue, n in adding.items():
            depth = sum(d.ready + (d.delayed or 0)
                        for d in (self.transport.depth(ln) for ln in self.lanes(queue)))
            if depth + n > limit[queue]:
                raise queue_full(queue, depth, limit[queue])

    # -- worker (fenced) ----------------------------------------------------------------
    def claim(
        self, queue: str, limit: int, *, worker_id: str, lease_s: float, now: float | None = None,
        start: int | None = None, claim_id: str | None = None,
    ) -> list[Job]:
        claim_id = new_claim_id() if claim_id is None else check_claim_id(claim_id)
        self._seen.add(queue)
        claiming = getattr(self.transport, "claiming", None)
        with claiming() if claiming is not None else contextlib.nullcontext():
            return self._claim(queue, limit, worker_id=worker_id, lease_s=lease_s,
                               claim_id=claim_id)

    def _claim(self, queue: str, limit: int, *, worker_id: str, lease_s: float,
               claim_id: str) -> list[Job]:
        jobs: list[Job] = []
        pending: list[Delivery] = []  # received, not yet handed out or dealt with
        try:
            for lane in self.lanes(queue):
                while len(jobs) < limit:
                    pending = self.transport.receive(lane, limit - len(jobs), lease_s=lease_s)
                    if not pending:
                        break
                    while pending:
                        job = self._hand_out(pending[0], worker_id=worker_id,
                                             lease_s=lease_s, claim_id=claim_id)
                        pending.pop(0)
                        if job is not None:
                            self._drop_earlier(jobs, job)
                            jobs.append(job)
                if len(jobs) >= limit:
                    break
            return self._still_held(jobs)
        except BaseException:
            self._abandon(jobs, pending)
            raise

    def _still_held(self, jobs: list[Job]) -> list[Job]:
        """``jobs`` less those whose delivery the broker took back during the claim (the
        channel that held it died between two receives, or while another thread of this
        backend reconnected): the broker hands those out again, so returning them would run
        them twice. A transport that can tell without asking the broker says so
        (``still_held``); for the others a claim is too short to lose a delivery."""
        check = getattr(self.transport, "still_held", None)
        if check is None or not jobs:
            return jobs
        with self._lock:
            held = [self._held.get(j.lease_token or "") for j in jobs]
        kept = check([h.delivery for h in held if h is not None])
        if all(kept) and None not in held:
            return jobs
        kept_it = iter(kept)
        kept = [h is not None and next(kept_it) for h in held]
        with self._lock:
            for j, ok in zip(jobs, kept, strict=True):
                if not ok:
                    self._held.pop(j.lease_token or "", None)
        self._unlease([j for j, ok in zip(jobs, kept, strict=True) if not ok])
        return [j for j, ok in zip(jobs, kept, strict=True) if ok]

    def _unlease(self, jobs: Sequence[Job]) -> None:
        """Hand-outs a claim drops without returning them, their messages gone or going back
        to the broker: a broker alone keeps nothing else of them. A companion gives back its
        store's leases (broker/companion.py), so the next hand-out does not count them lost."""

    def _abandon(self, jobs: list[Job], pending: Sequence[Delivery]) -> None:
        """A claim that raises returns nothing: what it received goes back to the broker now,
        not when this backend's connection closes (a live one would hold it until then). With
        a companion the store's leases are given back first (``_unlease``)."""
        back = list(pending)
        with self._lock:
            for j in jobs:
                h = self._held.pop(j.lease_token or "", None)
                if h is not None:
                    back.append(h.delivery)
        try:
            self._unlease(jobs)
        except Exception:  # the next take fences these leases; the messages must go back
            log.warning("%s: could not give back the store leases of a failed claim",
                        self.kind, exc_info=True)
        if back:
            try:
                self.transport.give_back(back)
            except Exception:  # the error being raised says more; the broker's lease ends
                log.warning("%s: could not give back %d message(s) of a failed claim",
                            self.kind, len(back), exc_info=True)

    def _drop_earlier(self, jobs: list[Job], job: Job) -> None:
        """Remove from ``jobs`` an earlier hand-out of ``job`` in the same claim. The broker
        hands a message out again only once it took it back from its holder: this transport
        lost it between two receives of the claim (its connection died, or the claim's
        receives outlasted the visibility timeout), so the earlier one's lease is gone. One
        claim must not return a job twice: a worker keys jobs by id (it ran one attempt twice,
        the stale one's and the new one's, over its concurrency)."""
        earlier = [j for j in jobs if j.id == job.id]
        if earlier:
            with self._lock:
                for j in earlier:
                    self._held.pop(j.lease_token or "", None)
            jobs[:] = [j for j in jobs if j.id != job.id]

    def _due(self, d: Delivery, at: float) -> Body | None:
        """The job of delivery ``d`` if it is one and is due at ``at``; otherwise the delivery
        is dealt with here (not a job: to the dead lane; early: delayed again) and None."""
        try:
            body = decode(d.body)
        except BadMessage as exc:
            log.error("%s: a message in %s is not a Conveyor job (%s): moved to the dead lane",
                      self.kind, d.lane, exc)
            self.transport.publish([Outgoing(Lane(d.lane.queue, None), d.body)])
            self.transport.settle([d])
            return None
        if body.run_at > at + EARLY:
            # Received early: the broker's longest delay is shorter than this one (or the
            # clocks of the producer and this worker differ). Wait the rest in the broker.
            self.transport.publish([self._outgoing(d.lane, body, delay=body.run_at - at)])
            self.transport.settle([d])
            return None
        return body

    def _hand_out(self, d: Delivery, *, worker_id: str, lease_s: float,
                  claim_id: str) -> Job | None:
        """The job of delivery ``d``, leased, or None if it is not to run now (not a job, not
        due yet, or out of attempts: each dealt with here)."""
        at = self.now()
        body = self._due(d, at)
        if body is None:
            return None
        attempt = body.attempts + 1 + max(d.deliveries - 1 - MAX_STALLS, 0)
        if attempt > body.max_attempts:
            # Handed out before to a holder that died or froze, as often as it may run.
            error = ErrorInfo("lease_expired", f"{self.kind} handed the job out again after "
                              "its holder stopped answering, and it has no attempts left")
            dead = body.failed(attempt - 1, error.as_dict(attempt - 1, at, None),
                               state=JobState.DEAD.value, finished_at=at)
            self.transport.publish([self._outgoing(Lane(body.queue, None), dead)])
            self.transport.settle([d])
            return None
        token = self._token(claim_id)
        with self._lock:
            self._held[token] = _Held(d, body, attempt, worker_id)
        return body.job(attempts=attempt, state=JobState.RUNNING, lease_token=token,
                        lease_expires_at=at + lease_s, attempted_at=at, worker_id=worker_id)

    def heartbeat(self, leases: Sequence[Lease], *, lease_s: float, now: float | None = None,
                  held: Collection[int] = ()) -> set[int]:
        lost: set[int] = set()
        mine: list[tuple[Lease, _Held]] = []
        with self._lock:
            for lease in leases:
                h = self._held.get(lease.token)
                if h is None or h.body.id != lease.job_id:
                    lost.add(lease.job_id)
                else:
                    mine.append((lease, h))
        if mine:
            kept = self.transport.extend([h.delivery for _, h in mine], lease_s=lease_s)
            for (lease, _), ok in zip(mine, kept, strict=True):
                if not ok:
                    lost.add(lease.job_id)
                    with self._lock:
                        self._held.pop(lease.token, None)
        return lost

    def ack(self, lease: Lease, result: str | None, *, now: float | None = None) -> None:
        # The result is not kept: a broker has nowhere to put it (capability "results").
        self._settle(lease, self._take(lease, pop=True))

    def ack_many(self, acks: Sequence[tuple[Lease, str | None]], *,
                 now: float | None = None) -> list[bool]:
        found: list[tuple[int, _Held]] = []
        done = [False] * len(acks)
        for i, (lease, _) in enumerate(acks):
            with contextlib.suppress(LeaseLost):
                found.append((i, self._take(lease, pop=True)))
        if found:
            settled = self.transport.settle([h.delivery for _, h in found])
            for (i, _), ok in zip(found, settled, strict=True):
                done[i] = ok
        return done

    def retry(self, lease: Lease, error: ErrorInfo, *, delay: float,
              now: float | None = None) -> JobState:
        held = self._take(lease, pop=False)
        if held.attempt >= held.body.max_attempts:
            self.kill(lease, error, now=now)
            return JobState.DEAD
        at = self.now() if now is None else now
        delay = max(float(delay), 0.0)
        state = JobState.SCHEDULED if delay > 0 else JobState.AVAILABLE
        again = held.body.failed(held.attempt, error.as_dict(held.attempt, at, held.worker_id),
                                 run_at=at + delay, state=state.value,
                                 worker_id=held.worker_id)
        self._replace(lease, held, self._outgoing(held.delivery.lane, again, delay=delay))
        return state

    def kill(self, lease: Lease, error: ErrorInfo, *, now: float | None = None) -> None:
        held = self._take(lease, pop=False)
        at = self.now() if now is None else now
        dead = held.body.failed(held.attempt, error.as_dict(held.attempt, at, held.worker_id),
                                state=JobState.DEAD.value, finished_at=at,
                                worker_id=held.worker_id)
        self._replace(lease, held, self._outgoing(Lane(held.body.queue, None), dead))

    def _replace(self, lease: Lease, held: _Held, new: Outgoing) -> None:
        """Publish ``new`` in place of the held delivery, then settle that delivery. The lease
        is checked with the broker first, so a zombie publishes nothing; it can still be lost
        between the publish and the settle (then both copies run: at-least-once)."""
        (alive,) = self.transport.extend([held.delivery], lease_s=held.body.timeout + 30)
        if not alive:
            with self._lock:
                self._held.pop(lease.token, None)
            raise LeaseLost(lease.job_id, f"{self.kind} took the message back")
        self.transport.publish([new])
        with self._lock:
            self._held.pop(lease.token, None)
        self._settle(lease, held)

    def release(self, leases: Sequence[Lease], *, now: float | None = None) -> list[int]:
        released = []
        for lease in leases:
            try:
                held = self._take(lease, pop=False)
            except LeaseLost:
                continue
            # A fresh message with the attempt not counted: giving the delivery back would
            # count it (the broker counts every hand-out).
            back = replace(held.body, attempts=held.attempt - 1)
            try:
                self._replace(lease, held, self._outgoing(held.delivery.lane, back))
            except LeaseLost:
                continue
            released.append(lease.job_id)
        return released

    def release_claim(self, queue: str, claim_id: str, *, now: float | None = None) -> list[int]:
        # A receive whose reply was lost left its messages with the broker, which gives them
        # back by itself (the channel closed with the connection, the visibility timeout).
        check_claim_id(claim_id)
        return []

    # -- maintenance: the broker's own ----------------------------------------------------
    def reap(self, *, limit: int = 1000, now: float | None = None) -> ReapResult:
        # The broker takes back a dead holder's messages itself; the attempt it cost is
        # counted when the message is received again (_hand_out).
        return ReapResult()

    def promote(self, *, limit: int = 1000, now: float | None = None) -> int:
        return 0  # delayed messages become receivable in the broker

    def maintenance_turn(self, interval: float) -> bool:
        return False  # nothing to reap, promote or prune here

    def prune(self, *, older_than: float, states: Sequence[JobState] = (JobState.SUCCEEDED,),
              limit: int = 1000, now: float | None = None) -> int:
        # Finished jobs are not kept (acked messages are gone); dead ones stay in the dead lane
        # until purged or redriven. The states are checked as a store checks them, so a caller's
        # mistake shows here too.
        for state in states:
            if not JobState(state).is_final:
                raise ValueError(f"prune only deletes finished jobs, not {state}")
        return 0

    # -- inspection and administration ------------------------------------------------------
    def get(self, job_id: int) -> Job | None:
        raise self._unsupported("lookup")

    def list_jobs(
        self, *, state: JobState | None = None, queue: str | None = None, task: str | None = None,
        cursor: int | None = None, limit: int = 50,
    ) -> Page:
        if state != JobState.DEAD or queue is None:
            raise self._unsupported("listing")
        bodies = self._peek_dead(queue)
        jobs = sorted((b for b in bodies if task is None or b.task == task),
                      key=lambda b: b.id, reverse=True)
        if cursor is not None:
            jobs = [b for b in jobs if b.id < cursor]
        page = jobs[:limit]
        more = len(jobs) > limit
        return Page([b.job(attempts=b.attempts, state=JobState.DEAD) for b in page],
                    page[-1].id if more and page else None)

    PEEK = 1000  # dead jobs one listing looks at, at most

    def _peek_dead(self, queue: str) -> list[Body]:
        lane = Lane(queue, None)
        got: list[Delivery] = []
        try:
            while len(got) < self.PEEK:
                more = self.transport.receive(lane, min(10, self.PEEK - len(got)), lease_s=30)
                if not more:
                    break
                got.extend(more)
        finally:
            self.transport.give_back(got, counted=True)
        bodies = []
        for d in got:
            try:
                bodies.append(decode(d.body))
            except BadMessage:
                continue
        return bodies

    def stats(self, *, now: float | None = None, worker_ttl: float = 60.0,
              finished: bool = True) -> Stats:
        at = self.now() if now is None else now
        listed = self.transport.queues()
        queues = sorted(set(listed) if listed is not None else self._seen)
        out = []
        for q in queues:
            depths = [self.transport.depth(ln) for ln in self.lanes(q)]
            dead = self.transport.depth(Lane(q, None))
            out.append(QueueStats(
                queue=q, available=sum(d.ready for d in depths),
                scheduled=sum(d.delayed or 0 for d in depths),
                running=sum(d.in_flight or 0 for d in depths), dead=dead.ready,
            ))
        return Stats(now=at, queues=out, workers=[])

    def redrive(self, job_ids: Sequence[int] | None = None, *, queue: str | None = None,
                now: float | None = None) -> int:
        if queue is None:
            raise self._unsupported("listing")
        at = self.now() if now is None else now
        wanted = None if job_ids is None else {int(i) for i in job_ids}
        lane = Lane(queue, None)
        moved = 0
        keep: list[Delivery] = []
        try:
            while True:
                got = self.transport.receive(lane, 10, lease_s=60)
                if not got:
                    break
                for d in got:
                    try:
                        body = decode(d.body)
                    except BadMessage:
                        keep.append(d)
                        continue
                    if wanted is not None and body.id not in wanted:
                        keep.append(d)
                        continue
                    again = replace(body, attempts=0, state=JobState.AVAILABLE.value,
                                    run_at=at, finished_at=None)
                    self.transport.publish([self._outgoing(self.lane(body.queue, body.priority),
                                                           again)])
                    self.transport.settle([d])
                    moved += 1
                if wanted is not None and moved == len(wanted):
                    break
        finally:
            self.transport.give_back(keep, counted=True)
        return moved

    def purge(self, *, state: JobState = JobState.DEAD, queue: str | None = None,
              job_ids: Sequence[int] | None = None) -> int:
        if state != JobState.DEAD or queue is None or job_ids is not None:
            raise self._unsupported("listing")
        return self.transport.purge(Lane(queue, None))

    def cancel(self, job_id: int, *, now: float | None = None) -> bool:
        raise self._unsupported("cancel")

    def make_due(self, job_ids: Sequence[int], *, now: float | None = None) -> int:
        raise self._unsupported("run_now")

    # -- waiting -------------------------------------------------------------------------
    def wait_for_jobs(self, queues: Sequence[str], timeout: float, *, verify: bool = True) -> bool:
        lanes = [ln for q in queues for ln in self.lanes(q)]
        return self.transport.wait(lanes, timeout)

    # -- what a broker cannot keep ---------------------------------------------------------
    def pause_queue(self, queue: str, *, now: float | None = None) -> bool:
        raise self._unsupported("pause")

    def resume_queue(self, queue: str, *, now: float | None = None) -> bool:
        raise self._unsupported("pause")

    def paused_queues(self) -> dict[str, float]:
        return {}  # nothing can be paused here

    def record_worker(self, info: WorkerInfo, *, now: float | None = None) -> None:
        pass  # no registry of workers (capability "workers"): stats lists none

    def remove_worker(self, worker_id: str) -> None:
        pass

    def cron_enqueue(self, schedule: str, tick: float, job: NewJob | None, *,
                     now: float | None = None) -> EnqueueResult | None:
        raise self._unsupported("cron")

    def cron_ticks(self) -> dict[str, float]:
        raise self._unsupported("cron")

    def set_cron_enabled(self, schedule: str, enabled: bool, *,
                         now: float | None = None) -> bool:
        raise self._unsupported("cron")

    def cron_states(self) -> dict[str, CronState]:
        raise self._unsupported("cron")

    def record_step(self, job_id: int, step: str, result: str | None, *,
                    uid: str | None) -> tuple[bool, str | None]:
        raise self._unsupported("steps")

    def get_batch(self, batch_id: str) -> BatchInfo | None:
        raise self._unsupported("dependencies")

    def record_history(self, points: Sequence[HistoryPoint]) -> None:
        raise self._unsupported("history")

    def history(self, *, queue: str | None = None, since: float,
                until: float) -> list[HistoryPoint]:
        raise self._unsupported("history")

    def rollup_history(self, *, keep_days: float, limit: int = 1000,
                       now: float | None = None) -> int:
        raise self._unsupported("history")

    def close(self) -> None:
        self.transport.close()


_id_lock = threading.Lock()
_last_id = 0


def new_id() -> int:
    """A job id: milliseconds since 2020 in the high bits, 22 random bits below (63 bits in
    all, so it fits SQL's bigint). Unique without a counter: two ids of one millisecond collide
    with odds of 1 in 4 million, and this process never repeats one (it counts up past the
    last)."""
    global _last_id
    ms = int(time.time() * 1000) - 1_577_836_800_000
    candidate = (ms << 22) | int.from_bytes(os.urandom(3), "big") & 0x3FFFFF
    with _id_lock:
        if candidate <= _last_id:
            candidate = _last_id + 1
        _last_id = candidate
        return candidate
