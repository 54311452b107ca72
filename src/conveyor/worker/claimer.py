"""Claiming: the claim loop, the plan that splits free slots across queues (weighted or
strict), the idle wait, and claims sent ahead.

The loop's modes, each a method of Claimer: read a claim sent ahead (_read_ahead); wait for
room (_wait_for_room); gather freed slots for one claim (_gather); claim now (_claim_now);
take the jobs the idle waiter claimed; give back jobs claimed at a stop (_give_back); and,
with nothing to do, back off and wait for jobs (_wait_idle).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import random
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from .. import faultpoints
from ..backends.base import ClaimReply, Lease, LoopClaims
from ..errors import ConfigurationError
from ..job import Job
from ..payload import check_queue_name
from .completer import Acks

if TYPE_CHECKING:
    from . import Worker
    from .capacity import Running

log = logging.getLogger("conveyor.worker")
T = TypeVar("T")
# From this many queues a claim round first asks the store which have work (ready_queues) and
# claims only there: a round otherwise calls the store once per queue until it meets one with
# work, a round trip per empty queue. Below it that walk costs at most a few calls.
READY_LOOKUP_FROM = 8
# A round after one that got all it asked for (a backlog) claims among the queues the last
# look found ready without looking again, for up to this long: on a backlog the look is a
# round trip per round for nothing new. Bounded, so a queue that gets work meanwhile is
# looked at within it.
READY_REUSE_S = 0.05
# A round of claims (Claimer._steps): yields (acks, queue, how many, how many start) per
# store call, is sent each call's (held, jobs), returns (held or None, every job claimed).
ClaimSteps = Generator[tuple[list[tuple[Lease, str | None]], str, int, int], ClaimReply,
                       tuple[list[bool] | None, list[Job]]]
Claimed = tuple[list[bool] | None, list[Job]]  # whether each ack held (None: no claim), jobs


def parse_queues(spec: str | Sequence[str] | Mapping[str, int]) -> dict[str, int]:
    """``"high:6,default:3,low:1"`` (or a list, or a dict) to ``{queue: weight}``."""
    items: list[tuple[str, int]] = []
    if isinstance(spec, Mapping):
        items = list(spec.items())
    else:
        parts = spec.split(",") if isinstance(spec, str) else list(spec)
        for raw in parts:
            part = raw.strip()
            if not part:
                continue
            name, _, weight = part.rpartition(":")
            if name and re.fullmatch(r"\s*-?[0-9]+\s*", weight):
                items.append((name.strip(), int(weight)))
            else:
                items.append((part, 1))  # no weight; the name itself may contain ':'
    if not items:
        raise ConfigurationError("no queues given: use e.g. --queues high:6,default:3,low:1")
    result: dict[str, int] = {}
    for queue, w in items:
        check_queue_name(queue)
        if w < 1:
            raise ConfigurationError(f"queue {queue!r} weight must be >= 1, got {w}")
        result[queue] = w
    return result


def plan_strict(free: int, weights: Mapping[str, int]) -> list[tuple[str, int]]:
    """Strict priority between queues: every slot to the heaviest queue (ties: listed order);
    only what it cannot use passes down to the next."""
    order = sorted(weights, key=lambda n: -weights[n])  # stable: ties keep their order
    return [(name, free if i == 0 else 0) for i, name in enumerate(order)]


def plan_claims(free: int, weights: Mapping[str, int],
                rng: random.Random) -> list[tuple[str, int]]:
    """Split ``free`` slots across queues by weight, in a weighted random order.

    Each slot goes to a queue drawn by weight, so over time queues get slots in proportion to
    their weights even when only one slot frees at a time. The order matters because the
    worker hands a queue's unused share to the queues after it (work-conserving).
    """
    if len(weights) == 1:  # the usual case: nothing to draw (a weighted draw per claim costs)
        return [(name, free) for name in weights]
    names = list(weights)
    counts = Counter(rng.choices(names, [weights[n] for n in names], k=free))
    # Weighted shuffle: sort by u**(1/w) descending (Efraimidis-Spirakis).
    order = sorted(names, key=lambda n: rng.random() ** (1.0 / weights[n]), reverse=True)
    return [(name, counts[name]) for name in order]


@dataclass
class _LoopState:
    """What the claim loop carries from one turn to the next."""

    free: int = 0  # this turn's free slots (a claim sized for sending ahead takes fewer)
    woken: bool = False  # the last idle wait was woken (jobs were said to be waiting)
    idle_claims: int = 0  # claims in a row that got nothing after a wake-up (backoff)
    waited: list[Job] | None = None  # jobs the idle waiter claimed right after its wake-up
    backlog: bool = False  # the last claim got all it asked for: more are likely waiting
    gather_until: float = 0.0  # while gathering freed slots for one claim: until when


class Claimer:
    """Claims jobs for the worker's free slots, and hands them to the runner."""

    def __init__(self, w: Worker) -> None:
        self.w = w
        self.weights = w.weights
        self.near: LoopClaims | None = None  # Backend.loop_claims(), set in Worker.run_async
        # A claim sent ahead (see _send_ahead), not read yet: (what finish takes, the acks it
        # carries, the slots it asked for).
        self.ahead: tuple[Any, list[tuple[Running, str | None]], int] | None = None
        # While the claim loop is about to claim (or waits for a slot, which a finishing job
        # frees just before it acks), acks ride with its next claim; when it is parked (idle,
        # backing off, stopped), the ack loop writes them on its own.
        self.parked = True
        self.claim_s = 0.001  # a claim call's duration, a moving average
        self._ready_seen: tuple[float, list[str]] | None = None  # the last look: when, what

    def _plan(self, free: int, among: list[str] | None = None) -> list[tuple[str, int]]:
        """``free`` slots split across the queues (those of ``among`` only, if given)."""
        w = self.w
        weights = self.weights if among is None else {q: self.weights[q] for q in among}
        if not weights:
            return []
        if w.strict:
            return plan_strict(free, weights)
        return plan_claims(free, weights, w._rng)

    @property
    def _looks_first(self) -> bool:
        return len(self.weights) >= READY_LOOKUP_FROM

    def _ready(self, reuse: bool = False) -> list[str] | None:
        """The queues with work (on a store thread), when a round should look first. With
        ``reuse`` (the last round was full), the last look's answer if it is recent."""
        if not self._looks_first:
            return None
        now = time.monotonic()
        seen = self._ready_seen
        if reuse and seen is not None and now - seen[0] < READY_REUSE_S:
            return seen[1]
        ready = self.w.backend.ready_queues(list(self.weights))
        self._ready_seen = (now, ready)
        return ready

    def _ran_dry(self, queue: str) -> None:
        """A claim in ``queue`` got less than it asked: a round that reuses the last look
        leaves it out (it is looked at again with the others once the look is redone)."""
        seen = self._ready_seen
        if seen is not None and queue in seen[1]:
            self._ready_seen = (seen[0], [q for q in seen[1] if q != queue])

    async def _park(self, waiting: Awaitable[T]) -> T:
        """Wait on something that may take a while, handing any pending acks to the ack loop."""
        completer = self.w.completer
        assert completer.ready is not None
        self.parked = True
        if completer.queued:
            completer.ready.set()
        try:
            return await waiting
        finally:
            self.parked = False

    async def _sleep_after_failure(self, what: str) -> None:
        log.exception("%s; retrying in %gs", what, self.w.poll_interval)
        await self._park(asyncio.sleep(self.w.poll_interval))

    # -- the loop ----------------------------------------------------------------------
    async def run(self) -> None:
        """Claim until the worker stops (then acks still queued go to the ack loop)."""
        try:
            await self._claim_until_stopped()
        finally:
            self.parked = True
            completer = self.w.completer
            if completer.queued and completer.ready is not None:
                completer.ready.set()

    async def _claim_until_stopped(self) -> None:
        w = self.w
        assert w.capacity.slot_freed is not None
        self.parked = False
        w._context = contextvars.copy_context()
        st = _LoopState()
        # (claimed jobs are started or released, a claim sent ahead included)
        while st.waited is not None or self.ahead is not None or not w.stopping:
            st.free = w.capacity.free()
            jobs: list[Job] | None
            if self.ahead is not None:
                jobs = await self._read_ahead(st)
                if not jobs:
                    continue  # to the claim or the idle wait (with a waiter's jobs, if any)
            elif st.waited is None:
                if await self._wait_for_room(st) or await self._gather(st):
                    continue
                jobs = await self._claim_now(st)
                if jobs is None:
                    continue
            else:
                jobs, st.waited = st.waited, None
                st.backlog = False
            if jobs:
                faultpoints.hit("after_claim")
            if w.stopping and jobs:
                await self._give_back(jobs)
                continue  # the loop ends, once a claim sent ahead is read and given back too
            if jobs:
                for job in jobs:
                    w.runner.admit(job)
                # The wake-up is used: an empty claim after this one means the queue ran dry,
                # not that limits hold its jobs back.
                st.idle_claims, st.woken = 0, False
                # Let the jobs just started reach their threads before the next claim is made
                # (its store call would otherwise go first and hold them up).
                await asyncio.sleep(0)
                continue
            if w.burst and await self.burst_turn():
                continue
            await self._wait_idle(st)

    async def burst_turn(self) -> bool:
        """Mode (a burst worker, whose claim got nothing): while jobs of its own run, wait for
        one to finish (its outcome may be a job to run: a child, a retry due now), up to a
        poll interval, then claim again; once none runs, stop if the store has no job waiting
        on the queues. True if it did either; False: jobs wait that limits hold back, and the
        idle wait's backoff applies as in any worker."""
        w = self.w
        slot_freed = w.capacity.slot_freed
        assert slot_freed is not None
        running = len(w.leases.jobs)
        if running or w.completer.queued:
            slot_freed.clear()
            deadline = time.monotonic() + w.poll_interval
            # Parked, so that the ack loop writes the acks of jobs that finished meanwhile.
            while (len(w.leases.jobs) >= running and w.leases.jobs and not slot_freed.is_set()
                   and time.monotonic() < deadline and not w.stopping):
                with contextlib.suppress(TimeoutError):
                    await self._park(asyncio.wait_for(slot_freed.wait(), 0.02))
            return True
        waiting = await w._call(w._store, w.backend.wait_for_jobs, list(self.weights), 0.01)
        if waiting:
            return False
        log.info("worker %s: no job waiting on its queues, stopping (burst)", w.id)
        w._request_stop()
        return True

    async def _read_ahead(self, st: _LoopState) -> list[Job] | None:
        """Mode: read the claim sent ahead. None if it failed (after a pause)."""
        assert self.ahead is not None
        asked = self.ahead[2]
        try:
            jobs = await self._finish_ahead()
        except Exception:
            await self._sleep_after_failure("claim failed")
            return None
        st.backlog = len(jobs) >= asked
        return jobs

    async def _wait_for_room(self, st: _LoopState) -> bool:
        """Mode: no room for a claim; wait for a slot to free. True if it waited."""
        w = self.w
        slot_freed = w.capacity.slot_freed
        assert slot_freed is not None
        # While held jobs keep the slots busy, claim in batches of half the prefetch or
        # more, not a job per round trip.
        if st.free > 0 and not (w.capacity.held and st.free < (w.prefetch + 1) // 2):
            return False
        slot_freed.clear()
        if w.completer.queued:
            # Acks that no claim will carry soon: the ack loop writes them meanwhile.
            await self._park(slot_freed.wait())
        else:
            await slot_freed.wait()
        return True

    async def _gather(self, st: _LoopState) -> bool:
        """Mode: jobs are waiting and most slots are still busy. Short jobs free their slots
        one after another; a claim per freed slot would pay a round trip (and on PostgreSQL a
        commit) per job. Wait up to about one claim round trip for half the slots, then claim
        them (and ack theirs) in one call. True if it waited."""
        w = self.w
        if st.backlog and not w.capacity.held and st.free < (w.concurrency + 1) // 2:
            now = time.monotonic()
            if not st.gather_until:
                st.gather_until = now + min(self.claim_s, 0.005)
            if now < st.gather_until:
                slot_freed = w.capacity.slot_freed
                assert slot_freed is not None
                slot_freed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(slot_freed.wait(), st.gather_until - now)
                return True
        st.gather_until = 0.0
        return False

    async def _claim_now(self, st: _LoopState) -> list[Job] | None:
        """Mode: claim for the free slots. None if the claim failed (after a pause)."""
        if st.backlog and self._may_send_ahead():
            # A batch of `concurrency` now, the next sent ahead once this reply is in
            # (_send_ahead): Redis runs that claim while this one's jobs start here.
            st.free = min(st.free, self.w.concurrency)
        try:
            started = time.monotonic()
            jobs = await self._claim(st.free, backlog=st.backlog)
            # The time a claim takes (a moving average): how long gathering may wait.
            self.claim_s += (time.monotonic() - started - self.claim_s) / 8
        except Exception:
            await self._sleep_after_failure("claim failed")
            return None
        st.backlog = len(jobs) >= st.free
        return jobs

    async def _give_back(self, jobs: list[Job]) -> None:
        """Mode: claimed while the stop came in: give them straight back, unrun (those the
        claim's thread already started run on, as every running job does at a stop)."""
        w = self.w
        runner = w.runner
        for job in [j for j in jobs if j.id in runner.started_early]:
            runner.admit(job)
        leases = [Lease(j.id, j.lease_token) for j in jobs
                  if j.lease_token and j.id not in w.leases.jobs]
        if leases:
            await w.completer.release(leases, "job(s) claimed at stop")

    async def _wait_idle(self, st: _LoopState) -> None:
        """Mode: the claim got nothing. Back off if a wake-up said there was work, then wait
        for jobs on a task thread, which claims them the moment they come."""
        w = self.w
        if st.woken:
            # Told there was work, yet the claim got none: concurrency or rate limits hold the
            # waiting jobs back. Back off instead of spinning on claims. A job of ours
            # finishing may have freed a concurrency slot: try again at once then.
            st.idle_claims += 1
            slot_freed = w.capacity.slot_freed
            assert slot_freed is not None
            slot_freed.clear()
            backoff = min(0.005 * 2 ** min(st.idle_claims, 10), 0.25, w.poll_interval)
            with contextlib.suppress(TimeoutError):
                await self._park(asyncio.wait_for(slot_freed.wait(), backoff))
        # The waiter's claim leaves out the slots of jobs whose ack is still being written:
        # they hold their leases until it lands, so the store never sees this worker hold
        # more than concurrency + prefetch jobs (a claim from here carries no acks).
        # (`free` has already left out those the ack loop is writing; the rest are queued.)
        try:
            wait = functools.partial(self._wait_then_claim, list(self.weights),
                                     st.free - len(w.completer.queued), w.capacity.startable())
            st.woken, st.waited = await self._park(w._pool.submit(wait).future)
        except Exception:
            log.exception("waiting for jobs failed")
            await self._park(asyncio.sleep(w.poll_interval))

    def _wait_then_claim(self, queues: list[str], free: int,
                         startable: int) -> tuple[bool, list[Job] | None]:
        """On a task thread (one is free for it: the pool has one more than slots): wait for a
        wake-up, and claim on this thread at once, without a hop to the loop and on to a store
        thread and back (the latency of an idle worker); the first ``startable`` jobs claimed
        are started here too (see Runner.start_early), the first of them on this very thread
        once this returns.
        The claim is the look at the store that tells a stale wake-up from real work. Returns
        (woken, the jobs claimed, or None if there was no claim to make)."""
        w = self.w
        claims: list[tuple[str, int]] = []
        if free > 0 and not w.stopping and not self._looks_first:
            # (On many queues the plan's few would rarely be the one woken for: the claim
            # after the wake-up looks first.)
            claims = self._plan(free)
        # A store that can make the claims in the wake-up's own round trip (Redis) does; with
        # the others this thread claims the moment the wake-up comes.
        woken, jobs = w.backend.wait_and_claim(queues, w.poll_interval, claims, worker_id=w.id,
                                               lease_s=w.lease_s, start=startable)
        if not woken:
            return False, None
        if jobs is None:
            if w.stopping or free <= 0:
                return True, None
            try:
                _, jobs = self._claim_on_thread(free, [], startable)
            except Exception:
                log.exception("claim failed")
                return True, None  # the loop claims again
        if jobs:
            w.runner.start_early(jobs, startable)
            return True, jobs
        # Nothing to claim: a stale wake-up, a job a neighbour took, or jobs that limits hold
        # back. A verified wait tells them apart: it returns at once only if jobs are waiting.
        return w.backend.wait_for_jobs(queues, w.poll_interval), None

    # -- one claim ---------------------------------------------------------------------
    async def _claim(self, free: int, *, backlog: bool = False) -> list[Job]:
        """A claim for ``free`` slots, from the loop where the store can (Backend.loop_claims),
        else on a store thread; pending acks ride with its first call. ``backlog``: the last
        round got all it asked for (see READY_REUSE_S)."""
        w = self.w
        completer = w.completer
        near = self.near
        ready: list[str] | None = None
        if near is not None and self._looks_first:
            ready = await w._call(w._store, self._ready, backlog)
        batch = completer.take()
        startable = w.capacity.startable()

        def claim() -> Claimed:
            held, jobs = self._claim_on_thread(free, batch, startable, reuse=backlog)
            w.runner.start_early(jobs, startable)
            return held, jobs

        held: list[bool] | None
        try:
            if near is not None and not w.stopping:
                held, jobs = await self._claim_on_loop(near, free, batch, startable,
                                                       functools.partial(self._send_ahead, free),
                                                       ready)
                w.runner.start_early(jobs, startable)
            else:
                held, jobs = await w._call(w._store, claim)
        except BaseException as exc:
            completer.acks_not_sent(batch, exc)
            raise
        if held is None:
            completer.put_back(batch)  # no claim was made: they go with the next one
        else:
            completer.acks_done(batch, held)
        return jobs

    async def _claim_on_loop(self, near: LoopClaims, free: int, acks: Acks, startable: int,
                             on_reply: Callable[[int], None],
                             ready: list[str] | None) -> Claimed:
        """_claim_on_thread's round, each store call awaited on the loop; what the loop cannot
        do without blocking (see LoopClaims) runs on a store thread. ``on_reply`` goes with a
        round of one call (one queue). ``ready``: the queues with work, if looked at first."""
        w = self.w
        steps = self._steps(free, acks, startable, ready)
        one_queue = len(self.weights) == 1
        try:
            step = next(steps)
            while True:
                step_acks, queue, want, start = step
                try:
                    got = await near.ack_and_claim(step_acks, queue, want, worker_id=w.id,
                                                   lease_s=w.lease_s, wanted=self._claiming,
                                                   on_reply=on_reply if one_queue else None,
                                                   start=start)
                    if callable(got):
                        got = await w._call(w._store, got)
                except Exception as exc:
                    step = steps.throw(exc)
                else:
                    step = steps.send(got)
        except StopIteration as done:
            result: Claimed = done.value
            return result

    def _claim_on_thread(self, free: int, acks: Acks, startable: int, *,
                         reuse: bool = False) -> Claimed:
        """The claims of one round (see _steps), made in turn on the calling (store or
        waiter) thread; on many queues, after a look at which have work (``reuse``: see
        _ready)."""
        w = self.w
        steps = self._steps(free, acks, startable, self._ready(reuse))
        backend = w.backend
        try:
            step = next(steps)
            while True:
                step_acks, queue, want, start = step
                try:
                    if step_acks:
                        got = backend.ack_and_claim(step_acks, queue, want, worker_id=w.id,
                                                    lease_s=w.lease_s, start=start)
                    else:
                        got = [], backend.claim(queue, want, worker_id=w.id, lease_s=w.lease_s,
                                                start=start)
                except Exception as exc:
                    step = steps.throw(exc)
                else:
                    step = steps.send(got)
        except StopIteration as done:
            result: Claimed = done.value
            return result

    def _claiming(self) -> bool:
        return not self.w.stopping

    def _steps(self, free: int, acks: Acks, startable: int,
               ready: list[str] | None = None) -> ClaimSteps:
        """The claims of one round, as a plan its caller carries out (_claim_on_thread on a
        thread, _claim_on_loop on the loop): ``free`` slots split across the queues by weight,
        each queue's unused share passed on to the next (work-conserving). Yields (acks, queue,
        how many, how many of them start at once) for each store call (``acks`` go with the
        first one only, else it is a plain claim), and is sent that call's (held, jobs), or
        thrown its error. The first ``startable`` jobs of the round start (Runner.start_early);
        the rest are claimed held (prefetch), not counted as attempts until they start.
        Returns whether each ack was held (None if no claim was made), and the jobs claimed.
        ``ready``: the only queues to claim from (those with work), if looked at first."""
        w = self.w
        claimed: list[Job] = []
        held: list[bool] | None = None
        acked = False  # the acks were written: from now on this round must return, not raise
        carry = 0
        full: list[str] = []
        for queue, share in self._plan(free, ready):
            want = share + carry
            if want <= 0 or w.stopping:
                continue
            start = max(startable - len(claimed), 0)
            try:
                if held is None and acks:
                    held, jobs = yield [(r.lease, result) for r, result in acks], queue, want, start
                    acked = True
                    faultpoints.hit("after_ack")
                else:
                    _, jobs = yield [], queue, want, start
                    if held is None:
                        held = []  # no acks to carry: a claim was made
            except Exception:
                if not claimed and not acked:
                    raise
                # Jobs claimed from earlier queues are ours now: run them, don't strand them.
                log.exception("claim on queue %s failed; running the %d job(s) already claimed",
                              queue, len(claimed))
                return held, claimed
            claimed.extend(jobs)
            carry = want - len(jobs)
            if len(jobs) == want:
                full.append(queue)
            elif ready is not None:
                self._ran_dry(queue)
        # Slots left over after every queue had its turn go to the queues that still had work.
        for queue in full:
            if carry <= 0 or w.stopping:
                break
            try:
                _, jobs = yield [], queue, carry, max(startable - len(claimed), 0)
            except Exception:
                log.exception("claim on queue %s failed; running the %d job(s) already claimed",
                              queue, len(claimed))
                return held, claimed
            claimed.extend(jobs)
            carry -= len(jobs)
        return held, claimed

    # -- claims sent ahead -------------------------------------------------------------
    def _may_send_ahead(self) -> bool:
        """Claims are sent ahead (see _send_ahead) on a store that claims from the loop, for
        one queue, and with prefetch of at least the concurrency: then a claim sent ahead takes
        a whole batch. (Without prefetch it could take only half the slots, and on Redis claims
        of four cost the store and the worker more per job than the overlap saved.)"""
        w = self.w
        return (self.near is not None and len(self.weights) == 1
                and w.prefetch >= w.concurrency and not w.stopping)

    def _send_ahead(self, asked: int, got: int) -> None:
        """Called the moment a claim's reply is in (``got`` of the ``asked`` jobs), before it is
        read into jobs and they start: if the claim got all it asked for (more are likely
        waiting) and a batch of slots beyond those is free, as it is when short jobs finish
        within a round trip, send the next claim now, with the acks waiting. A busy worker's
        store calls were otherwise in series with the loop's own work (reading a reply,
        starting its jobs, taking their outcomes, then the next claim) while the store waited.
        A claim is sent ahead only after a claim that got jobs, so one is never left out while
        the worker waits idle: the loop reads it next."""
        near = self.near
        if near is None or self.ahead is not None or got < asked or not self._may_send_ahead():
            return
        w = self.w
        batch_size = w.concurrency
        if w.capacity.free() - asked < batch_size:
            return
        completer = w.completer
        batch = completer.take()
        [queue] = self.weights
        sent = near.claim_ahead([(r.lease, result) for r, result in batch], queue, batch_size,
                                worker_id=w.id, lease_s=w.lease_s)
        if sent is None:
            completer.put_back(batch)  # nothing was sent: they go with the next claim
            return
        self.ahead = (sent, batch, batch_size)

    async def _finish_ahead(self) -> list[Job]:
        """The jobs of the claim _send_ahead sent (its acks settled as _claim settles them)."""
        w = self.w
        assert self.ahead is not None and self.near is not None
        sent, batch, asked = self.ahead
        self.ahead = None
        startable = w.capacity.startable()
        completer = w.completer
        try:
            got = await self.near.finish(sent,
                                         on_reply=functools.partial(self._send_ahead, asked))
            if callable(got):
                got = await w._call(w._store, got)
        except BaseException as exc:
            completer.acks_not_sent(batch, exc)
            raise
        held, jobs = got
        if batch:
            faultpoints.hit("after_ack")
        w.runner.start_early(jobs, startable)
        completer.acks_done(batch, held)
        return jobs
