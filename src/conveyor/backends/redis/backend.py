"""RedisBackend: the backend assembled from its parts, with what a worker does to get jobs:
claims (alone, behind acks, sent from the event loop) and the idle wait.

One Lua script per state transition; keys that fit one Cluster slot. The parts:
``transport.py`` (connections, retries, script calls; ``cluster.py``, the node a cluster
URL goes to), ``keys.py`` (the key layout), ``scripts.py`` (the Lua files and how they
load), ``core.py`` (running a script with the queue blocks it needs), ``enqueue.py``,
``settle.py`` (heartbeat, ack, retry, kill, release), ``maintenance.py`` (reap, promote,
sweep, prune), ``admin.py`` (get, list, stats, redrive, purge, cancel, workers),
``loop_claims.py`` (claims from the worker's event loop).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn, cast

import redis

from ...errors import ClaimLost, StoreError, StoreUnavailable
from ...job import Job, JobState, fast_constructor
from ..base import CLAIM_SCAN, Lease, LoopClaims, check_claim_id, new_claim_id
from .admin import AdminMixin
from .codec import CLAIM_BASE, NO_JOBS, _start_arg, _to_job, _tokens, loads
from .core import MAX_CACHED_QUEUES
from .enqueue import EnqueueMixin
from .history import RedisHistory
from .maintenance import MaintenanceMixin
from .outbox import OutboxMixin
from .settle import SettleMixin
from .transport import WAIT_SLICE, ScriptCall

# job.wait's counts of waiters (P:wait:<id> and P:wait:any, kept by count_waiter.lua): seconds
# a count outlives a waiter that stopped renewing it.
_WAITER_TTL = 60
# Job constructors kept for claimed jobs, one per kind of job (queue, worker, task and the
# fields its jobs share): more kinds than this and they are made again as they come.
_MAX_MAKERS = 256
log = logging.getLogger("conveyor.redis")

_Acks = Sequence[tuple[Lease, str | None]]


class RedisBackend(AdminMixin, MaintenanceMixin, SettleMixin, EnqueueMixin, RedisHistory,
                   OutboxMixin):
    """``redis://[[user]:password@]host[:port][/db][?prefix=NAME]`` (``rediss://`` for TLS),
    ``redis+cluster://host:port,host:port/?prefix=NAME`` for Redis Cluster (the node that serves
    the app's slot is followed: cluster.py). All keys of one app start with ``{NAME}:`` (default
    ``conveyor``); the braces are the Cluster hash tag. The key layout and the scripts are
    described in docs/redis.md, keys.py and at the top of ``lua/_common.lua``."""

    # -- claims -----------------------------------------------------------------------------
    def claim(
        self, queue: str, limit: int, *, worker_id: str, lease_s: float, now: float | None = None,
        start: int | None = None, claim_id: str | None = None,
    ) -> list[Job]:
        claim_id = new_claim_id() if claim_id is None else check_claim_id(claim_id)
        if limit <= 0:
            return []
        tokens = _tokens(limit, claim_id)
        args = [self._now_arg(now), limit, repr(float(lease_s)), worker_id, CLAIM_SCAN,
                _start_arg(start, limit), *tokens]
        try:
            res = self._run("claim", [queue], args, safe=False)
        except StoreUnavailable:
            self._give_back_lost_claim(queue, claim_id, now)
            raise
        return self._claimed(res, queue, worker_id, tokens)

    def take(self, job_id: int, token: str, *, worker_id: str, lease_s: float,
             now: float | None = None, message: str | None = None) -> Job | None:
        """A broker's delivery (take.lua). Sent again when its reply is lost: the script answers
        a repeat of the same token with the job as the first call left it."""
        args = [self._now_arg(now), int(job_id), token, worker_id, repr(float(lease_s)),
                message or ""]
        res = self._run("take", self._guess([job_id]), args, safe=True)
        if not res:  # not taken: finished (or spent, dead now), waiting, or unknown
            self._forget(job_id)
            return None
        job = self._job(res[1:])
        self._remember(job)
        return job

    def release_claim(self, queue: str, claim_id: str, *, now: float | None = None) -> list[int]:
        check_claim_id(claim_id)
        running_key = self.keys.queue(queue, "running")
        r = self._transport.r

        def tokens() -> list[tuple[int, str | None]]:
            ids = [int(i) for i in cast(list[str], r.zrange(running_key, 0, -1))]
            pipe = r.pipeline(transaction=False)
            for job_id in ids:
                pipe.hget(self.keys.job(job_id), "lease_token")
            return list(zip(ids, pipe.execute(), strict=True))

        found = self._transport.call("find a claim's leases", tokens, safe=True)
        leases = [Lease(job_id, token) for job_id, token in found
                  if token is not None and token[:24] == claim_id]
        return sorted(self.release(leases, now=now))

    def _give_back_lost_claim(self, queue: str, claim_id: str, now: float | None) -> None:
        """A claim's reply was lost: give back what it may have claimed (its jobs are nobody's),
        so they are not charged an attempt; if the store is still away, they come back when
        their leases run out."""
        try:
            released = self.release_claim(queue, claim_id, now=now)
        except StoreError:
            log.warning("a claim's reply was lost and its jobs could not be given back yet; "
                        "they come back when their leases run out")
            return
        if released:
            log.warning("a claim's reply was lost: gave its jobs back unrun: %s", released)

    def _claimed(self, res: list[Any], queue: str, worker_id: str,
                 tokens: list[str]) -> list[Job]:
        """The jobs of a claim script's reply, with the fields it leaves out put back."""
        emptied = self._emptied
        if not res or res[0] in NO_JOBS:
            if res and res[0] == "empty":  # what the idle wait that follows need not look for
                if len(emptied) > MAX_CACHED_QUEUES:
                    emptied.clear()
                emptied[queue] = (time.monotonic(), float(res[1]) if res[1] != "" else None)
            else:  # paused ({}), or limits hold every waiting job back ('hold'): it must look
                emptied.pop(queue, None)
            return []
        if emptied:
            emptied.pop(queue, None)
        at, expires = res[0], res[1]
        known = {"queue": queue, "state": "running", "attempted_at": at, "worker_id": worker_id,
                 "lease_expires_at": expires}
        jobs = []
        makers = self._makers
        attempted_at, lease_expires_at = float(at), float(expires)
        for (job_id, base, extra, errors), token in zip(res[2:], tokens, strict=False):
            if extra or errors or not base:
                h = dict(zip(CLAIM_BASE, base, strict=True)) if base else {}
                h.update(zip(extra[::2], extra[1::2], strict=True))
                h.update(known, lease_token=token)
                job = _to_job(int(job_id), h, errors)
                self._remember(job)
            else:
                # A job with nothing but the fields every job has (most are): what it shares
                # with the claim's other jobs of the same kind goes into one constructor per
                # claim. Its values come in CLAIM_BASE's order (no dict of them per job).
                (task, raw_args, priority, run_at, attempt, max_attempts, timeout_s, raw_meta,
                 created_at, uid) = base
                kind = (queue, worker_id, task, priority, max_attempts, timeout_s)
                make = makers.get(kind)
                if make is None:
                    if len(makers) >= _MAX_MAKERS:
                        makers.clear()
                    make = makers[kind] = fast_constructor(Job, {
                        "task": task, "queue": queue, "state": JobState.RUNNING,
                        "priority": int(priority), "max_attempts": int(max_attempts),
                        "timeout": float(timeout_s), "worker_id": worker_id,
                    })
                if raw_meta == "{}":  # (most jobs: no dict to merge into the call)
                    job = make(id=int(job_id), args=loads(raw_args), attempts=int(attempt),
                               run_at=float(run_at), created_at=float(created_at), uid=uid,
                               lease_token=token, attempted_at=attempted_at,
                               lease_expires_at=lease_expires_at)
                else:
                    job = make(id=int(job_id), args=loads(raw_args), attempts=int(attempt),
                               run_at=float(run_at), created_at=float(created_at), uid=uid,
                               lease_token=token, attempted_at=attempted_at,
                               lease_expires_at=lease_expires_at, meta=loads(raw_meta))
                self._queue_of[job.id] = queue  # (_remember: a claimed job is not final)
            jobs.append(job)
        if len(self._queue_of) > MAX_CACHED_QUEUES:
            self._queue_of.clear()
        return jobs

    def ack_and_claim(
        self, acks: _Acks, queue: str, limit: int, *,
        worker_id: str, lease_s: float, now: float | None = None, start: int | None = None,
    ) -> tuple[list[bool], list[Job]]:
        """The acks' script and the claim's in one pipelined round trip (the acks run first:
        Redis runs a connection's commands in order)."""
        if limit <= 0 or not acks:
            return super().ack_and_claim(acks, queue, limit, worker_id=worker_id,
                                         lease_s=lease_s, now=now, start=start)
        tokens = _tokens(limit)
        calls = self._claim_calls(acks, queue, limit, worker_id, lease_s, now, tokens, start)
        try:
            replies = self._transport.send_scripts(calls)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._claims_lost(acks, exc, now, queue, tokens)
        return self._claims_done(acks, queue, limit, worker_id, lease_s, now, tokens, replies,
                                 start)

    def _claim_calls(self, acks: _Acks, queue: str, limit: int, worker_id: str, lease_s: float,
                     now: float | None, tokens: list[str],
                     start: int | None) -> list[ScriptCall]:
        """The scripts of ack_and_claim: ack_many for the acks (if any), then the claim."""
        claim = ("claim", [*self.keys.header, *self.keys.block(queue)],
                 [1, queue, self._now_arg(now), limit, repr(float(lease_s)), worker_id,
                  CLAIM_SCAN, _start_arg(start, limit), *tokens])
        return [self._acks_call(acks, now), claim] if acks else [claim]

    def _claims_lost(self, acks: _Acks, exc: Exception, now: float | None,
                     queue: str, tokens: Sequence[str]) -> NoReturn:
        """The connection broke after _claim_calls were sent: what the claim may have taken is
        given back by its claim id (or, if the store is still away, comes back when its leases
        run out); the acks are checked one by one."""
        self._give_back_lost_claim(queue, tokens[0][:24], now)
        if not acks:
            raise StoreUnavailable(
                f"Redis at {self._where} is unreachable: claim failed ({exc}); "
                "the reply was lost, so it may or may not have happened") from exc
        held = self._acks_held(acks, None, now)
        raise ClaimLost(f"Redis at {self._where} is unreachable: claim failed ({exc}); "
                        f"{sum(held)} of {len(acks)} acks written", held) from exc

    def _claims_plain(self, acks: _Acks, replies: Sequence[Any]) -> bool:
        """Whether _claims_done can read these replies without calling the store: every ack
        answered 'ok', or 'lost' when no earlier try of it went unanswered, and the claim
        answered jobs or nothing."""
        if acks:
            held = replies[0]
            if not (isinstance(held, list) and len(held) == len(acks)):
                return False
            # (every ack 'ok', the usual answer, is told at once; a 'lost' needs a look)
            if held.count("ok") != len(held) and not all(
                    r == "ok" or (r == "lost" and not self._was_unsure(lease))
                    for r, (lease, _) in zip(held, acks, strict=True)):
                return False
        res = replies[-1]
        return isinstance(res, list) and (not res or res[0] not in ("need", "stale"))

    def _claims_done(self, acks: _Acks, queue: str, limit: int, worker_id: str, lease_s: float,
                     now: float | None, tokens: list[str], replies: Sequence[Any],
                     start: int | None) -> tuple[list[bool], list[Job]]:
        """What the replies of _claim_calls say: each ack held or not, and the jobs claimed.
        Anything unusual takes the careful path (blocking): an ack not settled is acked on its
        own, a claim answered 'need', 'stale' or an error is made again with claim()."""
        held = self._acks_held(acks, replies[0], now) if acks else []
        res = replies[-1]
        if isinstance(res, list) and (not res or res[0] not in ("need", "stale")):
            return held, self._claimed(res, queue, worker_id, tokens)
        if isinstance(res, Exception) and not isinstance(res, redis.ResponseError):
            raise StoreError(f"Redis at {self._where}: claim failed: {res}")
        # 'need'/'stale' (the queue's blocks changed), or an error reply: the careful path.
        return held, self.claim(queue, limit, worker_id=worker_id, lease_s=lease_s, now=now,
                                start=start)

    def loop_claims(self) -> LoopClaims | None:
        from .loop_claims import RedisLoopClaims

        return RedisLoopClaims.make(self)

    # -- waiting ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def finish_watch(self, job_id: int) -> Iterator[Callable[[float], None]]:
        """Counted in P:wait:<id> and P:wait:any, which the finishing scripts read
        (tell_waiters in _common.lua): a finish pushes a mark to P:wait:<id>:done, which this
        blocks on. The counts have a TTL, renewed as the wait goes on, so a waiter that dies
        is forgotten."""
        count_key, done = self.keys.waiters(job_id), self.keys.done(job_id)
        any_key = self.keys.waiters_anywhere()
        t = self._transport

        def count(by: int) -> None:
            run = t.bare_scripts["count_waiter"]
            t.call("count a waiter", functools.partial(
                run, keys=[count_key, any_key], args=[by, _WAITER_TTL]), safe=by == 0)

        def sleep(seconds: float) -> None:
            deadline = time.monotonic() + seconds
            while (left := deadline - time.monotonic()) > 0:
                count(0)  # renews the TTL
                # At most WAIT_SLICE a pop, as the blocking connections' socket timeout allows.
                block = functools.partial(t.rb.blpop, [done], timeout=min(left, WAIT_SLICE))
                if t.call("wait for a job to finish", block, safe=True) is not None:
                    return

        count(1)
        try:
            yield sleep
        finally:
            with contextlib.suppress(StoreError):
                count(-1)

    def wait_for_jobs(self, queues: Sequence[str], timeout: float, *,
                      verify: bool = True) -> bool:
        def pop(wake_keys: list[str], pause: float) -> tuple[bool, None] | None:
            # A marker only says "something changed": with verify, look again before reporting
            # work, so a worker whose neighbour took the job goes back to sleep. Popping a
            # marker twice is harmless, hence "safe" (retried while Redis is away).
            block = functools.partial(self._transport.rb.blpop, wake_keys, timeout=pause)
            popped = self._transport.call("wait for jobs", block, safe=True)
            if popped is not None and not verify:
                return True, None
            return None

        return self._wait(queues, timeout, pop)[0]

    def wait_and_claim(
        self, queues: Sequence[str], timeout: float, claims: Sequence[tuple[str, int]], *,
        worker_id: str, lease_s: float, start: int | None = None,
    ) -> tuple[bool, list[Job] | None]:
        """The idle wait with the claims sent in the same write as its blocking pop: Redis holds
        them behind the pop and runs them the moment it returns (a wake-up marker, or its
        timeout), so the jobs come back with the wake-up instead of a round trip after it; a
        stale marker, whose claims take nothing, does not end the wait. A worker killed while
        it waits takes the claims with it unrun (Redis drops a closed client's pending
        commands)."""
        claims = [(q, n) for q, n in claims if n > 0]
        if not claims:
            return super().wait_and_claim(queues, timeout, claims, worker_id=worker_id,
                                          lease_s=lease_s)
        starts: list[int] = []
        left = sum(n for _, n in claims) if start is None else max(start, 0)
        for _, n in claims:
            starts.append(min(n, left))
            left -= starts[-1]

        def pop(wake_keys: list[str], pause: float) -> tuple[bool, list[Job] | None] | None:
            tokens = [_tokens(n) for _, n in claims]
            try:
                woken, jobs = self._transport.call("wait for jobs", functools.partial(
                    self._pop_then_claim, wake_keys, pause, claims, starts, tokens, worker_id,
                    lease_s), safe=False)
            except StoreUnavailable:
                for (q, _), toks in zip(claims, tokens, strict=True):
                    self._give_back_lost_claim(q, toks[0][:24], None)
                raise
            if jobs is None:  # no claim ran: the caller claims
                return woken, None
            if jobs:
                return True, jobs
            # The claims found nothing: the pop timed out, or its marker was stale (a neighbour,
            # or this worker's own last claim, took the job; under a steady load the wake list
            # holds a few such). Wait on, claims behind the next pop: returning would leave the
            # next job to a wait without claims, a hop to the loop and a claim of its own. The
            # look before that pop (look.lua) still ends the wait for jobs that limits hold back.
            return None

        return self._wait(queues, timeout, pop, claims_look=True)

    def _wait(self, queues: Sequence[str], timeout: float,
              pop: Callable[[list[str], float], tuple[bool, list[Job] | None] | None], *,
              claims_look: bool = False) -> tuple[bool, list[Job] | None]:
        """The idle wait: look (look.lua), then block in ``pop`` on the wake lists for a slice,
        until ``pop`` has an answer, a job is waiting, ``wake()`` or ``close()`` is called, or
        the timeout runs out (False). ``claims_look``: ``pop`` claims behind its pop, so a
        claim that just found every queue empty answers for the look (see _looked)."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._wake_lock:
            generation = self._wake_gen
            self._waiters += 1
        wake_keys = [self.keys.queue(q, "wake") for q in queues] + [self._private_wake]
        try:
            while True:
                if self._wake_gen != generation or self._transport.closed:
                    return True, None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False, None
                try:
                    looked = self._looked(queues) if claims_look else None
                    ready, due_in = looked or self._peek(queues)
                    if ready:
                        return True, None
                    pause = min(remaining, WAIT_SLICE)
                    if due_in is not None:
                        pause = min(pause, due_in)
                    answer = pop(wake_keys, max(pause, 0.001))
                except Exception:
                    if self.closed:
                        # close() pulled the socket from under us: that is a wake-up
                        return True, None
                    raise
                if answer is not None:
                    return answer
        finally:
            with self._wake_lock:
                self._waiters -= 1

    def _looked(self, queues: Sequence[str]) -> tuple[bool, float | None] | None:
        """What a look at ``queues`` (``_peek``) would say, known from this backend's own
        claims: each queue's last claim, within a wait slice, found it empty (claim.lua's
        'empty'), and none of its scheduled jobs is due yet. Then (False, seconds until the
        first is due, or None); else None: look. An empty queue that gets a job after that
        claim gets a wake-up marker with it, which the pop that follows sees as it would after
        a look. (An idle worker's loop claims, then waits: a look in between was one round
        trip per job at a light load.)"""
        emptied = self._emptied
        now = time.monotonic()
        due_in: float | None = None
        for q in queues:
            seen = emptied.get(q)
            if seen is None or now - seen[0] > WAIT_SLICE:
                return None
            if seen[1] is not None:
                left = seen[1] - (now - seen[0])
                if left <= 0:
                    return None
                due_in = left if due_in is None else min(due_in, left)
        return False, due_in

    def _pop_then_claim(self, wake_keys: list[str], pause: float,
                        claims: Sequence[tuple[str, int]], starts: Sequence[int],
                        tokens: Sequence[list[str]], worker_id: str,
                        lease_s: float) -> tuple[bool, list[Job] | None]:
        """One BLPOP on the wake keys with the claims pipelined behind it: (woken, the jobs, or
        None if no claim ran: an error reply, such as a script not loaded yet, which
        send_scripts then loads). ``starts``: each claim's ``start``."""
        calls: list[ScriptCall] = [
            ("claim", [*self.keys.header, *self.keys.block(q)],
             [1, q, "", n, repr(float(lease_s)), worker_id, CLAIM_SCAN, first, *toks])
            for (q, n), first, toks in zip(claims, starts, tokens, strict=True)
        ]
        popped, *replies = self._transport.send_scripts(
            calls, first=("BLPOP", *wake_keys, repr(pause)))
        jobs: list[Job] | None = None
        for (q, _), toks, res in zip(claims, tokens, replies, strict=True):
            if isinstance(res, list) and (not res or res[0] not in ("need", "stale")):
                jobs = [*(jobs or []), *self._claimed(res, q, worker_id, toks)]
        if isinstance(popped, Exception):
            # The pop was refused (a cluster's MOVED or TRYAGAIN: see Transport.call, which
            # tries again); the claims behind it on the same node were refused too.
            if jobs is None:
                raise popped
            return True, jobs
        return popped is not None, jobs

    def ready_queues(self, queues: Sequence[str]) -> list[str]:
        if not queues:
            return []
        return [str(q) for q in self._look("all", queues)]

    def _look(self, mode: str, queues: Sequence[str]) -> Any:
        qs = list(dict.fromkeys(queues))
        return self._transport.call("look", functools.partial(
            self._script, "look", self.keys.look(qs), [mode, "", *qs]), safe=True)

    def _peek(self, queues: Sequence[str]) -> tuple[bool, float | None]:
        """(jobs are waiting now, seconds until the earliest scheduled job is due)."""
        res = self._look("any", queues)
        if int(res[0]):
            return True, None
        return False, float(res[1]) if res[1] != "" else None

    def wake(self) -> None:
        """Interrupt this process's waiters: a local flag, plus a marker on a key only this
        backend's waiters block on (so another worker's sleep is never disturbed)."""
        with self._wake_lock:
            self._wake_gen += 1
            waiters = self._waiters
        if not waiters or self.closed:
            return

        def push() -> None:
            try:
                pipe = self._transport.r.pipeline(transaction=True)
                pipe.lpush(self._private_wake, *["1"] * waiters)
                pipe.expire(self._private_wake, 60)
                pipe.execute()
            except Exception:  # best effort: the waiters see the flag after their slice anyway
                pass

        # Off the caller's thread: wake() runs on the worker's event loop at shutdown, which
        # must not stall on a Redis that is down.
        threading.Thread(target=push, name="conveyor-redis-wake", daemon=True).start()
