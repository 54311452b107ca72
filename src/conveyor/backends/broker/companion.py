"""A broker with a companion store: ``Conveyor("amqp://...", state="postgresql://...")``.

The broker dispatches (which worker runs which job, and when: its queues, its lease, its
delays); the companion store, any of SQLite, PostgreSQL or Redis, keeps the job records, so
everything a broker alone cannot answer is answered there: a job by id, listings, results,
the dead-letter browser, step records, unique keys, cron ticks, workers, history, stats with
the oldest job's age.

The order of writes, and what each crash leaves:

* Enqueue writes the records (ids, unique keys and ``max_depth`` are the store's), each with
  an outbox mark in the same write (``Backend.outbox``), then publishes one message per
  created job, then clears the marks. If the publish fails, the records are cancelled and the
  error raised. A crash between the record and the confirm leaves the mark: the sweep (each
  worker's maintenance tries every ``outbox_every``, one process at a time under the store's
  lock) publishes the message of a job still waiting whose mark is older than
  ``outbox_after``. Cron ticks and redrives are marked the same way. A crash after the publish
  but before the confirm makes a duplicate: ``take`` drops it once the job finished; while the
  job runs it is taken as a redelivery (the running attempt counted as a lost lease).
* A delivery is ``take``n in the store (the job's lease, fencing any older holder), then run.
  Not a live lease given for a delivery of this same message, though: SQS may hand one
  message to two receivers at once, and the second is then left alone, not run.
  A record that is finished (succeeded, dead, cancelled) is not run: the message is settled
  and dropped. So a message delivered again after its job succeeded (the broker lost the ack)
  does not run the job twice, and ``cancel`` works: the record is cancelled, its message is
  dropped when it comes.
* Ack, retry, kill and release write the record first (fenced by the lease token), then
  (retry, release) publish the next message, then settle the delivery. A crash after the
  record leaves the delivery unsettled, so the broker hands it out again: a final record drops
  it, a retried one runs it (its delay lost). The held delivery is their outbox: they need no
  mark. The next message is published only once the record says the attempt ended: it may be
  delivered at once, and its take must not find the attempt still running (that would fence
  it and record a lost lease it never had).
* An outcome (or a heartbeat) the store refuses settles the delivery only when the record
  has moved on without it (final, or held by a delivery of another message: a copy). Refused
  only because the store's lease ran out while the broker still held the message, the record
  still names this lease: the delivery goes back to the broker, whose next hand-out ``take``s
  the record again (the lost lease counted) and runs it. Settled, nothing would ever deliver
  or reap it. Held by another delivery of this very message (SQS handed one message to two
  receivers at once: its at-least-once delivery, or moto's receives racing), the delivery is
  left alone: SQS may act on a message through an outdated receipt handle (moto always does),
  so settling it could delete the message the holder of the record runs, and giving it back
  would hand that message out a third time. Each lease token names its delivery's message
  (``_message_mark``) for this.
* ``job.wait`` waits on the store's wake-ups (its finishing writes signal the waiters).

Not available with a companion either (``missing``): concurrency and rate limits, fair
sharing, pausing a queue and dependencies (chains, batches): each needs the claim to choose
among waiting jobs, and the broker chooses. Fair sharing is there when the broker does it
itself (SQS FIFO: a message group per fair_key). Unique keys are always the store's: each
message's deduplication id is its own job's, so the broker never drops one the store created.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import replace
from typing import Any, Literal

from ...errors import LeaseLost, StoreError
from ...job import Job, JobState
from ..base import Backend, BatchInfo, HistoryPoint, StoreLock
from ..types import (
    CronState,
    EnqueueResult,
    ErrorInfo,
    Lease,
    NewBatch,
    NewJob,
    Page,
    Stats,
    WorkerInfo,
)
from .core import BrokerBackend, _Held
from .message import Body
from .transport import Delivery, Outgoing, Transport

log = logging.getLogger("conveyor.broker")

MISSING_WITH_STATE = frozenset({"limits", "fair", "pause", "dependencies", "clock", "run_now",
                                "ordering"})
# What a holder whose lease the store refused does with its delivery (CompanionBackend._lapsed).
LetGo = Literal["back", "settle", "leave"]
# Between a lease token and the digest of its delivery's message id: tokens are hex otherwise.
MESSAGE_MARK = "m"


class CompanionBackend(BrokerBackend):
    missing = MISSING_WITH_STATE

    # The outbox (see the module's docstring): marks older than this are swept (longer than a
    # publish and its confirm take, so a sweep does not race a live enqueue) ...
    outbox_after = 120.0
    # ... by one process of the fleet at a time, each process trying at most this often.
    outbox_every = 30.0

    def __init__(self, url: str, transport: Transport, levels: Sequence[int],
                 state: Backend) -> None:
        super().__init__(url, transport, levels)
        self.missing = MISSING_WITH_STATE - (transport.supports & {"fair"})
        self.state = state
        # A store without an outbox keeps the old window: a crash between the record and
        # its message leaves the record waiting.
        self._outbox = type(state).outbox_sweep is not Backend.outbox_sweep
        state.outbox = self._outbox
        self._next_sweep = 0.0

    # -- producer -----------------------------------------------------------------------
    def enqueue_many(self, jobs: Sequence[NewJob], *, now: float | None = None,
                     batches: Sequence[NewBatch] = ()) -> list[EnqueueResult]:
        if batches or any(j.after or j.after_refs for j in jobs):
            raise self._unsupported("dependencies")
        for j in jobs:
            if j.concurrency_key is not None or j.rate_key is not None:
                raise self._unsupported("limits")
            if j.fair_key is not None and "fair" in self.missing:
                raise self._unsupported("fair")
        results = self.state.enqueue_many(jobs, now=now)
        out = []
        for job, res in zip(jobs, results, strict=True):
            if res.created:
                self._seen.add(job.queue)
                out.append(self._message(job, res))
        try:
            self.transport.publish(out)
        except BaseException:
            ids = [r.id for r, j in zip(results, jobs, strict=True) if r.created]
            with contextlib.suppress(Exception):
                self.state.cancel_many(ids)
            raise
        self._confirm([r.id for r in results if r.created])
        return results

    def _confirm(self, job_ids: Sequence[int]) -> None:
        """The broker has the messages of these jobs: clear their outbox marks. A failure here
        leaves the marks, and a sweep publishes those jobs again: a duplicate message, which
        ``take`` makes safe for a finished job and counts as a lost lease for a running one."""
        if self._outbox and job_ids:
            try:
                self.state.outbox_confirm(job_ids)
            except Exception as exc:
                log.warning("could not clear the outbox marks of %d job(s) (%s): a sweep "
                            "publishes them again", len(job_ids), exc)

    def _message(self, job: NewJob, res: EnqueueResult) -> Outgoing:
        run_at = job.run_at if job.run_at is not None else res.at + max(job.delay, 0.0)
        body = Body(id=res.id, uid=res.uid or "", task=job.task, queue=job.queue, args=job.args,
                    meta=job.meta, priority=job.priority, max_attempts=job.max_attempts,
                    timeout=job.timeout, created_at=res.at, run_at=run_at,
                    fair_key=job.fair_key, unique_key=job.unique_key)
        return self._outgoing(self.lane(job.queue, job.priority), body,
                              delay=max(run_at - res.at, 0.0), dedup_id=f"job:{res.id}")

    def _republish(self, job: Job, *, delay: float = 0.0) -> Outgoing:
        """The message of a job the store holds (redrive, a cron tick's job)."""
        body = Body(id=job.id, uid=job.uid or "", task=job.task, queue=job.queue,
                    args=_json(job.args), meta=_json(job.meta), priority=job.priority,
                    max_attempts=job.max_attempts, timeout=job.timeout,
                    created_at=job.created_at, run_at=job.run_at, attempts=job.attempts,
                    fair_key=job.fair_key, unique_key=job.unique_key)
        return self._outgoing(self.lane(job.queue, job.priority), body, delay=delay)

    # -- worker -------------------------------------------------------------------------
    def _hand_out(self, d: Delivery, *, worker_id: str, lease_s: float,
                  claim_id: str) -> Job | None:
        body = self._due(d, self.now())
        if body is None:
            return None
        mark = _message_mark(d)
        token = self._token(claim_id) + mark
        job = self.state.take(body.id, token, worker_id=worker_id, lease_s=lease_s,
                              message=mark or None)
        if job is None and mark and self._lapsed(body.id, token) == "leave":
            # Held, on a live lease, by another delivery of this very message: SQS handed it
            # to two receivers at once. Left alone (see _lapsed): the holder settles it, and
            # if SQS hands it out again the record decides then. Unless the holder is this
            # claim's own earlier hand-out: the broker took the message back between the
            # claim's receives, and the claim keeps the newer one (_drop_earlier).
            if not self._earlier_in_claim(body.id, claim_id):
                return None
            job = self.state.take(body.id, token, worker_id=worker_id, lease_s=lease_s)
        if job is None:
            # Finished (a duplicate, or cancelled), unknown to the store, or spent (its last
            # attempt's holder stopped answering: take made it dead): not run.
            self.transport.settle([d])
            return None
        with self._lock:
            self._held[token] = _Held(d, body, job.attempts, worker_id)
        return job

    def _earlier_in_claim(self, job_id: int, claim_id: str) -> bool:
        with self._lock:
            return any(h.body.id == job_id and token.startswith(claim_id)
                       for token, h in self._held.items())

    def _unlease(self, jobs: Sequence[Job]) -> None:
        # Before the messages go back: a store lease left behind would make the next take
        # fence it and record a lost attempt for a job that never ran.
        leases = [Lease(j.id, j.lease_token) for j in jobs if j.lease_token]
        if leases:
            self.state.release(leases)

    def heartbeat(self, leases: Sequence[Lease], *, lease_s: float, now: float | None = None,
                  held: Collection[int] = ()) -> set[int]:
        lost = super().heartbeat(leases, lease_s=lease_s, now=now, held=held)
        kept = [lease for lease in leases if lease.job_id not in lost]
        if kept:
            refused = self.state.heartbeat(kept, lease_s=lease_s, now=now, held=held)
            # The worker stops these jobs and writes no outcome: their deliveries are dealt
            # with here, or they would stay held (on RabbitMQ, for the connection's life).
            self._refused([lease for lease in kept if lease.job_id in refused])
            lost |= refused
        return lost

    def _drop(self, lease: Lease) -> _Held | None:
        with self._lock:
            held = self._held.pop(lease.token, None)
        return held if held is not None and held.body.id == lease.job_id else None

    def _refused(self, leases: Sequence[Lease]) -> None:
        """The store refused these leases: let go of their deliveries (see _lapsed)."""
        found = [(h, lease) for lease in leases if (h := self._drop(lease)) is not None]
        self._let_go([(h, self._lapsed(lease.job_id, lease.token)) for h, lease in found])

    def _lapsed(self, job_id: int, token: str) -> LetGo:
        """What to do with the delivery of a lease the store refused, by the record.

        ``back``: the lease only ran out. The record still names ``token``, or waits unleased
        (a reap, a released claim), and this delivery is the only way it runs again: it goes
        back to the broker, whose next hand-out ``take``s the record (counting the lost lease
        as the stores count one) and runs it. The broker, not the store's reap, hands the job
        out again: it holds the delivery and its hand-out count, and a record moved on by a
        reap would need a message anyway.
        ``settle``: the record is final (a cancel, a duplicate), or a delivery of another
        message (a copy) holds it: this message is not needed.
        ``leave``: another delivery of this same message holds it (the broker handed the
        message out twice at once). Nothing is sent: a settle through this delivery's handle
        would delete the message that holder runs, and the holder settles it itself."""
        with contextlib.suppress(Exception):
            job = self.state.get(job_id)
            if job is None or job.is_final:
                return "settle"
            if job.state is JobState.RUNNING:
                if job.lease_token == token:
                    return "back"
                mine = _message_of(token)
                return "leave" if mine and mine == _message_of(job.lease_token) else "settle"
            return "back" if job.state in (JobState.AVAILABLE, JobState.SCHEDULED) else "settle"
        return "back"  # the store did not answer: the broker keeps the message (at-least-once)

    def _let_go(self, found: Sequence[tuple[_Held, LetGo]]) -> None:
        back = [h.delivery for h, what in found if what == "back"]
        if back:
            self.transport.give_back(back)
        done = [h.delivery for h, what in found if what == "settle"]
        if done:
            self.transport.settle(done)

    def ack(self, lease: Lease, result: str | None, *, now: float | None = None) -> None:
        self._final(lease, lambda: self.state.ack(lease, result, now=now))

    def _final(self, lease: Lease, record: Callable[[], object]) -> None:
        """End the delivery of ``lease`` with a final outcome: ``record`` writes it in the
        store, then the message is settled. A store that refuses the lease decides by the
        record whether the message goes back (``_let_go``); one that did not answer leaves it
        unknown whether the outcome was recorded, so the broker keeps the message, whose next
        hand-out the record decides on."""
        held = self._drop(lease)
        if held is None:
            raise LeaseLost(lease.job_id)
        try:
            record()
        except LeaseLost:
            self._let_go([(held, self._lapsed(lease.job_id, lease.token))])
            raise
        except BaseException:
            self.transport.give_back([held.delivery])
            raise
        self._settle_recorded([(held, "settle")])

    def _settle_recorded(self, found: Sequence[tuple[_Held, LetGo]]) -> None:
        """``_let_go`` once the store has answered the outcomes: a broker error is logged, not
        raised. The outcomes stand, and a message left unsettled comes back to a take that the
        record decides on (as after a crash between the two). Raised, the worker would write
        the outcomes again, find their leases gone, and log recorded successes as discarded."""
        try:
            self._let_go(found)
        except StoreError as exc:
            log.warning("%s: %d outcome(s) recorded, but their messages were not settled (%s): "
                        "they come back, and are dropped or run by what the records say",
                        self.kind, len(found), exc)

    def ack_many(self, acks: Sequence[tuple[Lease, str | None]], *,
                 now: float | None = None) -> list[bool]:
        found = [(lease, result, self._drop(lease)) for lease, result in acks]
        mine = [(lease, result, h) for lease, result, h in found if h is not None]
        try:
            held = (self.state.ack_many([(lease, r) for lease, r, _ in mine], now=now)
                    if mine else [])
        except BaseException:
            self.transport.give_back([h.delivery for _, _, h in mine])
            raise
        self._settle_recorded([(h, "settle" if ok else self._lapsed(lease.job_id, lease.token))
                               for (lease, _, h), ok in zip(mine, held, strict=True)])
        done_mine = iter(held)
        return [next(done_mine) if h is not None else False for _, _, h in found]

    def retry(self, lease: Lease, error: ErrorInfo, *, delay: float,
              now: float | None = None) -> JobState:
        held = self._take(lease, pop=False)
        if held.attempt >= held.body.max_attempts:
            self.kill(lease, error, now=now)
            return JobState.DEAD
        delay = max(float(delay), 0.0)
        at = self.now() if now is None else now
        again = self._outgoing(held.delivery.lane,
                               _with(held.body, attempts=held.attempt, run_at=at + delay),
                               delay=delay)
        self._drop(lease)
        try:
            # The record first (fenced): the next message may be delivered the moment it is
            # published, and its take must find the attempt ended. A crash before the publish
            # leaves the delivery unsettled: the broker hands it out again.
            state = self.state.retry(lease, error, delay=delay, now=now)
            if state is not JobState.DEAD:
                self.transport.publish([again])
        except LeaseLost:
            self._let_go([(held, self._lapsed(lease.job_id, lease.token))])
            raise
        except Exception:
            # The store did not answer: whether the retry was recorded is unknown. The
            # delivery goes back to the broker, whose next hand-out the record decides on.
            self.transport.give_back([held.delivery])
            raise
        self._settle_recorded([(held, "settle")])
        return state

    def kill(self, lease: Lease, error: ErrorInfo, *, now: float | None = None) -> None:
        self._final(lease, lambda: self.state.kill(lease, error, now=now))

    def release(self, leases: Sequence[Lease], *, now: float | None = None) -> list[int]:
        released = []
        for lease in leases:
            held = self._drop(lease)
            if held is None:
                continue
            # The record first, then the next message (see retry), then the delivery.
            done = self.state.release([lease], now=now)
            if not done:
                self._let_go([(held, self._lapsed(lease.job_id, lease.token))])
                continue
            try:
                self.transport.publish([self._outgoing(held.delivery.lane, held.body)])
            except BaseException:
                self.transport.give_back([held.delivery])  # it is the job's message still
                raise
            self._settle_recorded([(held, "settle")])
            released.extend(done)
        return released

    # -- maintenance: the store's records -----------------------------------------------------
    def prune(self, *, older_than: float, states: Sequence[JobState] = (JobState.SUCCEEDED,),
              limit: int = 1000, now: float | None = None) -> int:
        return self.state.prune(older_than=older_than, states=states, limit=limit, now=now)

    def maintenance_turn(self, interval: float) -> bool:
        # Reap and promote are the broker's; the companion's own chore is the outbox's sweep.
        at = time.monotonic()
        if self._outbox and at >= self._next_sweep:
            self._next_sweep = at + self.outbox_every
            self.sweep_outbox()
        return False

    SWEEP_BATCH = 100

    def sweep_outbox(self) -> int:
        """Publish again the messages of jobs whose outbox mark is older than ``outbox_after``
        (their enqueue, cron tick or redrive died between the record and the message), under
        the store's lock so that one process does it at a time. The jobs published."""
        lock = self.state.try_lock("conveyor.outbox", ttl=max(self.outbox_after, 60.0))
        if lock is None:
            return 0
        done = 0
        try:
            while True:
                jobs = self.state.outbox_sweep(older_than=self.outbox_after,
                                               limit=self.SWEEP_BATCH)
                if not jobs:
                    break
                at = self.now()
                self.transport.publish([self._republish(j, delay=max(j.run_at - at, 0.0))
                                        for j in jobs])
                self._confirm([j.id for j in jobs])
                done += len(jobs)
                log.warning("published the messages of %d job(s) again: their records were "
                            "written, their messages not confirmed", len(jobs))
                # Not "a short batch was the last": the store passes over marks that need no
                # message, so a batch may be short with more due behind it (base.py).
                if not lock.renew():
                    break
        finally:
            lock.release()
        return done

    def try_lock(self, name: str, *, ttl: float) -> StoreLock | None:
        return self.state.try_lock(name, ttl=ttl)

    # -- inspection and administration: the store ---------------------------------------------
    def get(self, job_id: int) -> Job | None:
        return self.state.get(job_id)

    def wait_finished(self, job_id: int, timeout: float) -> Job | None:
        # The records are the store's, and so are the wake-ups of their finishing writes.
        return self.state.wait_finished(job_id, timeout)

    @contextlib.contextmanager
    def finish_watch(self, job_id: int) -> Iterator[Callable[[float], None]]:
        with self.state.finish_watch(job_id) as sleep:
            yield sleep

    def get_batch(self, batch_id: str) -> BatchInfo | None:
        return self.state.get_batch(batch_id)

    def list_jobs(
        self, *, state: JobState | None = None, queue: str | None = None, task: str | None = None,
        cursor: int | None = None, limit: int = 50,
    ) -> Page:
        return self.state.list_jobs(state=state, queue=queue, task=task, cursor=cursor,
                                    limit=limit)

    def stats(self, *, now: float | None = None, worker_ttl: float = 60.0,
              finished: bool = True) -> Stats:
        return self.state.stats(now=now, worker_ttl=worker_ttl, finished=finished)

    def redrive(self, job_ids: Sequence[int] | None = None, *, queue: str | None = None,
                now: float | None = None) -> int:
        if job_ids is None:
            ids: list[int] = []
            cursor = None
            while True:
                page = self.state.list_jobs(state=JobState.DEAD, queue=queue, cursor=cursor,
                                            limit=500)
                ids.extend(j.id for j in page.jobs)
                if page.next_cursor is None:
                    break
                cursor = page.next_cursor
        else:
            ids = [int(i) for i in job_ids]
        moved = 0
        for start in range(0, len(ids), 100):
            chunk = ids[start:start + 100]
            before = {i for i in chunk
                      if (j := self.state.get(i)) is not None and j.state is JobState.DEAD}
            if not before:
                continue
            if self._outbox:  # the records are due again before their messages exist
                self.state.outbox_mark(sorted(before), now=now)
            moved += self.state.redrive(sorted(before), now=now)
            again = [j for i in sorted(before) if (j := self.state.get(i)) is not None
                     and j.state is JobState.AVAILABLE]
            self.transport.publish([self._republish(j) for j in again])
            self._confirm(sorted(before))
        return moved

    def purge(self, *, state: JobState = JobState.DEAD, queue: str | None = None,
              job_ids: Sequence[int] | None = None) -> int:
        return self.state.purge(state=state, queue=queue, job_ids=job_ids)

    def cancel(self, job_id: int, *, now: float | None = None) -> bool:
        # The message stays in the broker until delivered; take refuses the cancelled record.
        return self.state.cancel(job_id, now=now)

    def cancel_many(self, job_ids: Sequence[int], *, now: float | None = None) -> list[int]:
        return self.state.cancel_many(job_ids, now=now)

    def make_due(self, job_ids: Sequence[int], *, now: float | None = None) -> int:
        raise self._unsupported("run_now")  # the broker holds the delay: it cannot be shortened

    # -- what the store keeps ----------------------------------------------------------------
    def paused_queues(self) -> dict[str, float]:
        return {}

    def record_worker(self, info: WorkerInfo, *, now: float | None = None) -> None:
        self.state.record_worker(info, now=now)

    def remove_worker(self, worker_id: str) -> None:
        self.state.remove_worker(worker_id)

    def cron_enqueue(self, schedule: str, tick: float, job: NewJob | None, *,
                     now: float | None = None) -> EnqueueResult | None:
        if job is not None and (job.after or job.concurrency_key or job.rate_key
                                or (job.fair_key and "fair" in self.missing)):
            raise self._unsupported("dependencies")
        res = self.state.cron_enqueue(schedule, tick, job, now=now)
        if res is not None and res.created and job is not None:
            # A crash before this publish leaves the tick's record marked in the outbox (the
            # tick is taken): the sweep publishes it, as an enqueue's.
            self.transport.publish([self._message(job, res)])
            self._confirm([res.id])
        return res

    def cron_ticks(self) -> dict[str, float]:
        return self.state.cron_ticks()

    def set_cron_enabled(self, schedule: str, enabled: bool, *,
                         now: float | None = None) -> bool:
        return self.state.set_cron_enabled(schedule, enabled, now=now)

    def cron_states(self) -> dict[str, CronState]:
        return self.state.cron_states()

    def record_step(self, job_id: int, step: str, result: str | None, *,
                    uid: str | None) -> tuple[bool, str | None]:
        return self.state.record_step(job_id, step, result, uid=uid)

    def record_history(self, points: Sequence[HistoryPoint]) -> None:
        self.state.record_history(points)

    def history(self, *, queue: str | None = None, since: float,
                until: float) -> list[HistoryPoint]:
        return self.state.history(queue=queue, since=since, until=until)

    def rollup_history(self, *, keep_days: float, limit: int = 1000,
                       now: float | None = None) -> int:
        return self.state.rollup_history(keep_days=keep_days, limit=limit, now=now)

    def schema_version(self) -> int | None:
        return self.state.schema_version()

    def startup_warnings(self) -> list[str]:
        return self.state.startup_warnings()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.state.close()


def _message_mark(d: Delivery) -> str:
    """The end of every lease token given for a delivery of ``d``'s message: the mark and a
    digest of the message's id, where the broker names its messages ('' where it does not).
    A holder whose lease the store refused can then tell whether the holder of the record runs
    this very message (``_lapsed``), and ``take`` leaves a live lease of it alone."""
    if d.message_id is None:
        return ""
    return MESSAGE_MARK + hashlib.blake2b(d.message_id.encode(), digest_size=8).hexdigest()


def _message_of(token: str | None) -> str | None:
    """The digest of the message a lease token's delivery carried (``_message_mark``), if any."""
    _, mark, digest = (token or "").rpartition(MESSAGE_MARK)
    return digest if mark else None


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _with(body: Body, **changes: Any) -> Body:
    return replace(body, **changes)

