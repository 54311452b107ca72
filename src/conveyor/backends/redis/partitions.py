"""One app spread over several hash tags (``?partitions=N``), so over several Cluster shards.

A plain app keeps every key under one hash tag, ``{prefix}``: one slot, so one node of a
Cluster, and one Redis core for all its work. With ``partitions=N`` the app is N stores of the
plain layout, partition ``p`` under ``{prefix#p}`` (a slot of its own, which the Cluster spreads
over its shards like any other), each a RedisBackend with its own connections and scripts.
This module is the router in front of them. The model, and what it keeps:

* A queue lives in one partition: ``key_slot(queue) % N``, with Redis's own hash-tag rule, so
  queues named ``reports{acme}`` and ``emails{acme}`` share a partition (queue names may hold
  braces for this: payload.check_queue_name). Everything of a queue
  (its jobs, pause, depth limit, fair sharing) is in that partition's scripts, atomic as on a
  plain app.
* A job id says which partition holds it: partition p makes ids ``n * ID_STRIDE + p``
  (``new_id`` in lua/_core.lua), so get, ack, cancel and redrive go straight there.
* Per partition, and so scoped to the queues of one partition: unique keys, concurrency and
  rate keys (a key used by queues of two partitions counts separately in each: the limit
  holds per partition), dependencies and batches (a job's parents, its batch and the batch's
  callbacks must be in its partition; ``enqueue_many`` refuses otherwise).
* An ``enqueue_many`` whose jobs are in several partitions (and have no dependencies or
  batches) is one atomic write per partition: if one fails, the ones before it stand.
* Cron: a tick and its job are one write in the job's queue's partition, so each tick is
  enqueued once as long as a schedule keeps its queue's partition; a tick taken without a job
  (a schedule's first sight) goes to partition 0; disabling and enabling write every
  partition. ``cron_ticks`` and ``cron_states`` merge them.
* Partition 0 also holds what is not of a queue: workers, store-wide locks, the maintenance
  turn, the history, the clock.
* Reads that span queues (stats, listings, paused queues) ask every partition and merge;
  a listing is newest first by id across them. Reap, promote and prune go partition by
  partition, each under its own scripts.
* An idle worker whose queues are in several partitions waits on all of them through one
  connection per node, subscribed to their queues' wake-ups (wakes.py); one that has all its
  queues in one partition waits, claims and acks exactly as on a plain app, loop claims
  included.

The number of partitions is recorded in partition 0 at first use, and a different number is
refused: moving queues between partitions is not done (their jobs would stay behind).
A broker's companion may be partitioned too: take and the outbox marks go by id, a sweep
partition by partition.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any, cast
from urllib.parse import parse_qsl, urlencode, urlsplit

from redis.crc import key_slot

from ...errors import ConfigurationError, StoreError, UnknownParent
from ...job import Job, JobState
from .. import forking
from ..base import (
    Backend,
    BatchInfo,
    ClaimReply,
    CronState,
    EnqueueResult,
    ErrorInfo,
    HistoryPoint,
    Lease,
    LoopClaims,
    NewBatch,
    NewJob,
    Page,
    ReapResult,
    Stats,
    StoreLock,
    WorkerInfo,
    check_filters,
)
from .backend import RedisBackend
from .keys import ID_STRIDE
from .wakes import Waiter, WakeHub, node_key

MAX_PARTITIONS = ID_STRIDE
_Acks = Sequence[tuple[Lease, str | None]]


def partitions_of(url: str) -> tuple[int, str]:
    """(N of ``partitions=N``, 1 if absent; the URL without it)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    values = [v for k, v in query if k == "partitions"]
    if not values:
        return 1, url
    text = values[-1]
    if not text.isdigit() or not 1 <= int(text) <= MAX_PARTITIONS:
        raise ConfigurationError(f"partitions must be a whole number from 1 to {MAX_PARTITIONS},"
                                 f" got {text!r}")
    rest = [(k, v) for k, v in query if k != "partitions"]
    return int(text), parts._replace(query=urlencode(rest)).geturl()


@functools.lru_cache(maxsize=4096)  # (claims and acks ask it for the same few queues)
def queue_partition(queue: str, partitions: int) -> int:
    """The partition of ``queue``: its slot (Redis's rule: the part in braces, if any) mod N."""
    if partitions <= 1:
        return 0
    try:
        raw = queue.encode()
    except UnicodeEncodeError:  # a lone surrogate: PayloadError, as every store says
        check_filters(queue=queue)
        raise
    return int(key_slot(raw)) % partitions


def id_partition(job_id: int) -> int:
    return int(job_id) % ID_STRIDE


class PartitionedRedis(Backend):
    """``redis://...?partitions=N`` or ``redis+cluster://...?partitions=N``: see the module."""

    # Guarantees that span queues of different partitions: one atomic write and one ascending
    # id order for a call's jobs, dependencies, batches, limits and unique keys across them
    # (the conformance tests that need them are marked; the rest run here in full).
    missing = frozenset({"cross_queue"})

    def __init__(self, url: str) -> None:
        self.url = url
        self.n, base = partitions_of(url)
        self.parts = [RedisBackend(base, partition=p) for p in range(self.n)]
        self.prefix = self.parts[0].prefix.rpartition("#")[0]
        self._checked = False
        self._hub = WakeHub(self.parts)
        self._waiting: set[Waiter] = set()  # this process's grouped waits (_wait_each)
        self._waiting_lock = threading.Lock()
        forking.register(self)

    def _after_fork_in_child(self) -> None:
        # A parent thread may have held the lock; its waits are not the child's.
        self._waiting, self._waiting_lock = set(), threading.Lock()

    def _check_count(self) -> None:
        """Before the first write or claim (opening the backend makes no call, as on a plain
        app): record N in partition 0, or refuse an N other than the recorded one."""
        if self._checked:
            return
        home = self.parts[0]
        t = home._transport
        key = f"{home.keys.p}:partitions"
        t.call("record the partitions", lambda: t.r.set(key, self.n, nx=True), safe=True)
        recorded = int(cast(Any, t.call("read the partitions", lambda: t.r.get(key), safe=True)))
        if recorded != self.n:
            raise ConfigurationError(
                f"the app {self.prefix!r} was made with partitions={recorded}, not {self.n}: "
                "its queues live in the partitions that number gives (moving them is not done)")
        self._checked = True

    # -- routing ----------------------------------------------------------------------------
    def of_queue(self, queue: str) -> RedisBackend:
        return self.parts[queue_partition(queue, self.n)]

    def of_job(self, job_id: int) -> RedisBackend:
        p = id_partition(job_id)
        if p >= self.n:
            return self.parts[0]  # no such job here: partition 0 says so
        return self.parts[p]

    def _by_job(self, items: Sequence[Any], id_of: Callable[[Any], int]) -> dict[int, list[int]]:
        """Positions of ``items`` by the partition of each one's job id."""
        out: dict[int, list[int]] = {}
        for i, item in enumerate(items):
            p = id_partition(id_of(item))
            out.setdefault(p if p < self.n else 0, []).append(i)  # (unknown: 0 says so)
        return out

    def _queues_by_part(self, queues: Sequence[str]) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for q in queues:
            out.setdefault(queue_partition(q, self.n), []).append(q)
        return out

    # -- producer ---------------------------------------------------------------------------
    def enqueue_many(self, jobs: Sequence[NewJob], *, now: float | None = None,
                     batches: Sequence[NewBatch] = ()) -> list[EnqueueResult]:
        self._check_count()
        if not jobs:
            return self.parts[0].enqueue_many(jobs, now=now, batches=batches)
        where = [queue_partition(j.queue, self.n) for j in jobs]
        linked = bool(batches) or any(j.after or j.after_refs or j.batch_id or j.callback_of
                                      for j in jobs)
        if linked:
            self._check_links(jobs, where)
        if len(set(where)) == 1:
            return self.parts[where[0]].enqueue_many(jobs, now=now, batches=batches)
        if linked:
            raise ConfigurationError(
                "a write with dependencies or batches must have all its jobs in one partition: "
                f"queues {sorted({j.queue for j in jobs})} are in partitions "
                f"{sorted(set(where))} (docs/redis.md, partitions)")
        results: list[EnqueueResult | None] = [None] * len(jobs)
        for p in sorted(set(where)):
            at = [i for i, w in enumerate(where) if w == p]
            for i, res in zip(at, self.parts[p].enqueue_many([jobs[i] for i in at], now=now),
                              strict=True):
                results[i] = res
        return [r for r in results if r is not None]

    def _check_links(self, jobs: Sequence[NewJob], where: Sequence[int]) -> None:
        for job, p in zip(jobs, where, strict=True):
            for parent in job.after:
                if id_partition(parent) != p:
                    if self.get(parent) is None:
                        raise UnknownParent(f"job {job.queue!r} waits for job {parent}, which "
                                            "the store does not hold")
                    raise ConfigurationError(
                        f"job {parent} is in partition {id_partition(parent)}, and a job of "
                        f"queue {job.queue!r} (partition {p}) cannot wait for it: a job's "
                        "parents must be in its partition (docs/redis.md, partitions)")

    # -- a broker's companion --------------------------------------------------------------------
    @property
    def outbox(self) -> bool:
        return self.parts[0].outbox

    @outbox.setter
    def outbox(self, on: bool) -> None:
        for part in self.parts:
            part.outbox = on

    def take(self, job_id: int, token: str, *, worker_id: str, lease_s: float,
             now: float | None = None, message: str | None = None) -> Job | None:
        return self.of_job(job_id).take(job_id, token, worker_id=worker_id, lease_s=lease_s,
                                        now=now, message=message)

    def outbox_mark(self, job_ids: Sequence[int], *, now: float | None = None) -> None:
        ids = list(job_ids)
        for p, at in self._by_job(ids, int).items():
            self.parts[p].outbox_mark([ids[i] for i in at], now=now)

    def outbox_confirm(self, job_ids: Sequence[int]) -> None:
        ids = list(job_ids)
        for p, at in self._by_job(ids, int).items():
            self.parts[p].outbox_confirm([ids[i] for i in at])

    def outbox_sweep(self, *, older_than: float, limit: int = 100,
                     now: float | None = None) -> list[Job]:
        # Partition by partition within ``limit``: a partition's sweep renews every mark it
        # returns, so none is taken here that would then be left out.
        out: list[Job] = []
        for part in self.parts:
            if len(out) >= limit:
                break
            out += part.outbox_sweep(older_than=older_than, limit=limit - len(out), now=now)
        return sorted(out, key=lambda j: j.id)

    # -- worker -----------------------------------------------------------------------------
    def claim(self, queue: str, limit: int, *, worker_id: str, lease_s: float,
              now: float | None = None, start: int | None = None,
              claim_id: str | None = None) -> list[Job]:
        self._check_count()
        return self.of_queue(queue).claim(queue, limit, worker_id=worker_id, lease_s=lease_s,
                                          now=now, start=start, claim_id=claim_id)

    def heartbeat(self, leases: Sequence[Lease], *, lease_s: float, now: float | None = None,
                  held: Collection[int] = ()) -> set[int]:
        lost: set[int] = set()
        for p, at in self._by_job(leases, lambda lease: lease.job_id).items():
            lost |= self.parts[p].heartbeat([leases[i] for i in at], lease_s=lease_s, now=now,
                                            held=held)
        return lost

    def ack(self, lease: Lease, result: str | None, *, now: float | None = None) -> None:
        self.of_job(lease.job_id).ack(lease, result, now=now)

    def ack_many(self, acks: _Acks, *, now: float | None = None) -> list[bool]:
        done = [False] * len(acks)
        for p, at in self._by_job(acks, lambda a: a[0].job_id).items():
            for i, ok in zip(at, self.parts[p].ack_many([acks[i] for i in at], now=now),
                             strict=True):
                done[i] = ok
        return done

    def ack_and_claim(self, acks: _Acks, queue: str, limit: int, *, worker_id: str,
                      lease_s: float, now: float | None = None,
                      start: int | None = None) -> ClaimReply:
        home = queue_partition(queue, self.n)
        if all(id_partition(lease.job_id) == home for lease, _ in acks):
            return self.parts[home].ack_and_claim(acks, queue, limit, worker_id=worker_id,
                                                  lease_s=lease_s, now=now, start=start)
        held = self.ack_many(acks, now=now)
        return held, self.claim(queue, limit, worker_id=worker_id, lease_s=lease_s, now=now,
                                start=start)

    def loop_claims(self) -> LoopClaims | None:
        return _LoopClaims(self)

    def retry(self, lease: Lease, error: ErrorInfo, *, delay: float,
              now: float | None = None) -> JobState:
        return self.of_job(lease.job_id).retry(lease, error, delay=delay, now=now)

    def kill(self, lease: Lease, error: ErrorInfo, *, now: float | None = None) -> None:
        self.of_job(lease.job_id).kill(lease, error, now=now)

    def release(self, leases: Sequence[Lease], *, now: float | None = None) -> list[int]:
        out: list[int] = []
        for p, at in self._by_job(leases, lambda lease: lease.job_id).items():
            out += self.parts[p].release([leases[i] for i in at], now=now)
        return out

    def release_claim(self, queue: str, claim_id: str, *, now: float | None = None) -> list[int]:
        return self.of_queue(queue).release_claim(queue, claim_id, now=now)

    # -- maintenance -------------------------------------------------------------------------
    def reap(self, *, limit: int = 1000, now: float | None = None) -> ReapResult:
        out = ReapResult()  # up to ``limit`` in all, as the contract says
        for part in self.parts:
            if out.count >= limit:
                break
            got = part.reap(limit=limit - out.count, now=now)
            out.requeued.extend(got.requeued)
            out.dead.extend(got.dead)
            out.queues.update(got.queues)
        return out

    def promote(self, *, limit: int = 1000, now: float | None = None) -> int:
        return sum(part.promote(limit=limit, now=now) for part in self.parts)

    def maintenance_turn(self, interval: float) -> bool:
        return self.parts[0].maintenance_turn(interval)

    def prune(self, *, older_than: float, states: Sequence[JobState] = (JobState.SUCCEEDED,),
              limit: int = 1000, now: float | None = None) -> int:
        # Up to ``limit`` in all, as the contract says: a caller that gets ``limit`` calls again.
        done = 0
        for part in self.parts:
            if done >= limit:
                break
            done += part.prune(older_than=older_than, states=states, limit=limit - done,
                               now=now)
        return done

    # -- inspection and administration -------------------------------------------------------
    def get(self, job_id: int) -> Job | None:
        return self.of_job(job_id).get(job_id)

    def get_batch(self, batch_id: str) -> BatchInfo | None:
        for part in self.parts:  # a batch is in the partition of its jobs: look in each
            found = part.get_batch(batch_id)
            if found is not None:
                return found
        return None

    def list_jobs(self, *, state: JobState | None = None, queue: str | None = None,
                  task: str | None = None, cursor: int | None = None, limit: int = 50) -> Page:
        self._check_count()  # (an admin reading with another N would misread)
        if queue is not None:
            return self.of_queue(queue).list_jobs(state=state, queue=queue, task=task,
                                                  cursor=cursor, limit=limit)
        if limit <= 0:
            return Page(jobs=[], next_cursor=None)
        # Newest first by id across partitions: each partition's first ``limit`` below the
        # cursor, merged; more remain if any partition had more or some were left out here.
        pages = [part.list_jobs(state=state, task=task, cursor=cursor, limit=limit)
                 for part in self.parts]
        merged = sorted((j for page in pages for j in page.jobs), key=lambda j: j.id,
                        reverse=True)
        jobs = merged[:limit]
        more = len(merged) > limit or any(page.next_cursor is not None for page in pages)
        return Page(jobs=jobs, next_cursor=jobs[-1].id if more and jobs else None)

    def stats(self, *, now: float | None = None, worker_ttl: float = 60.0,
              finished: bool = True) -> Stats:
        self._check_count()
        each = [part.stats(now=now, worker_ttl=worker_ttl, finished=finished)
                for part in self.parts]
        queues = sorted((q for s in each for q in s.queues), key=lambda q: q.queue)
        return Stats(now=each[0].now, queues=queues,
                     workers=[w for s in each for w in s.workers])

    def redrive(self, job_ids: Sequence[int] | None = None, *, queue: str | None = None,
                now: float | None = None) -> int:
        self._check_count()
        if job_ids is not None:
            ids = list(job_ids)
            return sum(self.parts[p].redrive([ids[i] for i in at], queue=queue, now=now)
                       for p, at in self._by_job(ids, int).items())
        if queue is not None:
            return self.of_queue(queue).redrive(queue=queue, now=now)
        return sum(part.redrive(now=now) for part in self.parts)

    def purge(self, *, state: JobState = JobState.DEAD, queue: str | None = None,
              job_ids: Sequence[int] | None = None) -> int:
        self._check_count()
        if job_ids is not None:
            ids = list(job_ids)
            return sum(self.parts[p].purge(state=state, queue=queue,
                                           job_ids=[ids[i] for i in at])
                       for p, at in self._by_job(ids, int).items())
        if queue is not None:
            return self.of_queue(queue).purge(state=state, queue=queue)
        return sum(part.purge(state=state) for part in self.parts)

    def cancel(self, job_id: int, *, now: float | None = None) -> bool:
        return self.of_job(job_id).cancel(job_id, now=now)

    def cancel_many(self, job_ids: Sequence[int], *, now: float | None = None) -> list[int]:
        ids = list(job_ids)
        out: list[int] = []
        for p, at in self._by_job(ids, int).items():
            out += self.parts[p].cancel_many([ids[i] for i in at], now=now)
        return sorted(out)

    def make_due(self, job_ids: Sequence[int], *, now: float | None = None) -> int:
        ids = list(job_ids)
        return sum(self.parts[p].make_due([ids[i] for i in at], now=now)
                   for p, at in self._by_job(ids, int).items())

    # -- waiting for one job ------------------------------------------------------------------
    def wait_finished(self, job_id: int, timeout: float) -> Job | None:
        return self.of_job(job_id).wait_finished(job_id, timeout)

    @contextlib.contextmanager
    def finish_watch(self, job_id: int) -> Iterator[Callable[[float], None]]:
        with self.of_job(job_id).finish_watch(job_id) as sleep:
            yield sleep

    # -- waiting for jobs -----------------------------------------------------------------------
    def ready_queues(self, queues: Sequence[str]) -> list[str]:
        self._check_count()
        ready: set[str] = set()
        for found in self._look_each("all", self._queues_by_part(queues)).values():
            ready.update(str(q) for q in found)
        return [q for q in queues if q in ready]

    def _look_each(self, mode: str, groups: dict[int, list[str]]) -> dict[int, Any]:
        """look.lua (``mode``) on each partition of ``groups`` (partition -> queues): the
        partitions one node serves in one write on one connection (their scripts are the same,
        and a node runs a script for any slot it serves), so a look over 64 partitions costs
        a round trip per node, not 64. A partition whose look is refused there (its route
        was stale: MOVED; a script not loaded yet) looks on its own connections, which follow
        the redirection."""
        by_node: dict[Any, list[int]] = {}
        for p in groups:
            by_node.setdefault(node_key(self.parts[p]), []).append(p)
        out: dict[int, Any] = {}
        for ps in by_node.values():
            replies: list[Any] = []
            if len(ps) > 1:
                carrier = self.parts[ps[0]]._transport
                calls = [("look", self.parts[p].keys.look(groups[p]), [mode, "", *groups[p]])
                         for p in ps]
                replies = carrier.call("look", functools.partial(carrier.send_scripts, calls),
                                       safe=True)
            for i, p in enumerate(ps):
                reply = replies[i] if i < len(replies) else None
                if reply is None or isinstance(reply, Exception):
                    reply = self.parts[p]._look(mode, groups[p])
                out[p] = reply
        return out

    def wait_for_jobs(self, queues: Sequence[str], timeout: float, *,
                      verify: bool = True) -> bool:
        self._check_count()
        groups = self._queues_by_part(queues)
        if len(groups) <= 1:
            p, qs = next(iter(groups.items())) if groups else (0, list(queues))
            return self.parts[p].wait_for_jobs(qs, timeout, verify=verify)
        return self._wait_each(groups, timeout, verify)

    def _wait_each(self, groups: dict[int, list[str]], timeout: float, verify: bool) -> bool:
        """Wait on every partition of ``groups`` at once: those whose wake channels the hub
        has subscribed (wakes.py) in this thread, by their messages; any other on its wake
        list, a thread each. The first that has work (or whose subscription is lost) ends the
        wait; the threads' waits are then ended by a wake-up of that partition's waiters in
        this process, which only makes them look again."""
        deadline = time.monotonic() + max(0.0, timeout)
        while True:  # again after a lost subscription: subscribe and look anew
            waiter = Waiter(verify=verify)
            with self._waiting_lock:
                self._waiting.add(waiter)
            try:
                with self._hub.watch(groups, waiter) as watched:
                    rest = {p: qs for p, qs in groups.items() if p not in watched}
                    threads, outcome = self._wait_on_lists(rest, deadline, verify, waiter)
                    try:
                        woken = self._wait_watched(
                            {p: groups[p] for p in watched}, deadline, waiter)
                    finally:
                        outcome["stopped"].append(True)  # what the threads say next is moot
                        for p in rest:
                            self.parts[p].wake()
                        for t in threads:
                            t.join()
            finally:
                with self._waiting_lock:
                    self._waiting.discard(waiter)
            if outcome["woken"]:
                return True
            if outcome["errors"]:
                raise outcome["errors"][0]
            if woken is not None:
                return woken

    def _wait_on_lists(self, rest: dict[int, list[str]], deadline: float, verify: bool,
                       waiter: Waiter) -> tuple[list[threading.Thread], dict[str, list[Any]]]:
        """A thread per partition of ``rest`` waiting on its wake lists; the first that is
        woken, or fails, ends ``waiter``."""
        outcome: dict[str, list[Any]] = {"woken": [], "errors": [], "stopped": []}

        def one(p: int, qs: list[str]) -> None:
            try:
                woken = self.parts[p].wait_for_jobs(qs, deadline - time.monotonic(),
                                                    verify=verify)
            except BaseException as exc:  # handed to the caller
                if not outcome["stopped"]:
                    outcome["errors"].append(exc)
                    waiter.end()
                return
            # Once the wait is over, these waits are ended by a wake(), which says nothing.
            if woken and not outcome["stopped"]:
                outcome["woken"].append(True)
                waiter.end()

        threads = [threading.Thread(target=one, args=(p, qs), daemon=True,
                                    name=f"conveyor-redis-wait-{p}")
                   for p, qs in rest.items()]
        for t in threads:
            t.start()
        return threads, outcome

    def _wait_watched(self, watched: dict[int, list[str]], deadline: float,
                      waiter: Waiter) -> bool | None:
        """Look at each watched partition, then sleep until a wake-up on one of them (looked
        at again; without verify, reported at once), the earliest scheduled job is due, the
        waiter is ended, or the deadline. None: a subscription was lost."""
        due_at = dict.fromkeys(watched, 0.0)  # when to look at each again: all at once first
        while True:
            waiter.event.clear()  # before the look: a wake-up after it sets the event again
            if waiter.ended:
                return True
            if waiter.lost:
                return None
            now = time.monotonic()
            if now >= deadline:
                return False
            fired = waiter.take_fired()
            if fired and not waiter.verify:
                return True
            due = {p: watched[p] for p, at in due_at.items() if p in fired or at <= now}
            try:
                looks = self._look_each("any", due) if due else {}
            except Exception:
                if self.closed:  # close() pulled the socket from under the look
                    return True
                raise
            for p, res in looks.items():
                if int(res[0]):
                    return True
                due_at[p] = math.inf if res[1] == "" else now + float(res[1])
            pause = min(deadline, *due_at.values()) - time.monotonic() if due_at else (
                deadline - time.monotonic())
            if pause > 0:
                waiter.event.wait(pause)

    def wait_and_claim(self, queues: Sequence[str], timeout: float,
                       claims: Sequence[tuple[str, int]], *, worker_id: str, lease_s: float,
                       start: int | None = None) -> tuple[bool, list[Job] | None]:
        self._check_count()
        groups = self._queues_by_part([*queues, *(q for q, _ in claims)])
        if len(groups) == 1:
            p = next(iter(groups))
            return self.parts[p].wait_and_claim(queues, timeout, claims, worker_id=worker_id,
                                                lease_s=lease_s, start=start)
        return self.wait_for_jobs(queues, timeout, verify=False), None

    def wake(self) -> None:
        with self._waiting_lock:
            waiting = list(self._waiting)
        for waiter in waiting:
            waiter.end()
        for part in self.parts:
            part.wake()

    # -- what partition 0 holds -----------------------------------------------------------------
    def try_lock(self, name: str, *, ttl: float) -> StoreLock | None:
        return self.parts[0].try_lock(name, ttl=ttl)

    def record_worker(self, info: WorkerInfo, *, now: float | None = None) -> None:
        self.parts[0].record_worker(info, now=now)

    def remove_worker(self, worker_id: str) -> None:
        self.parts[0].remove_worker(worker_id)

    def now(self) -> float:
        return self.parts[0].now()

    def record_history(self, points: Sequence[HistoryPoint]) -> None:
        self.parts[0].record_history(points)

    def history(self, *, queue: str | None = None, since: float,
                until: float) -> list[HistoryPoint]:
        return self.parts[0].history(queue=queue, since=since, until=until)

    def rollup_history(self, *, keep_days: float, limit: int = 1000,
                       now: float | None = None) -> int:
        return self.parts[0].rollup_history(keep_days=keep_days, limit=limit, now=now)

    # -- pausing queues --------------------------------------------------------------------------
    def pause_queue(self, queue: str, *, now: float | None = None) -> bool:
        return self.of_queue(queue).pause_queue(queue, now=now)

    def resume_queue(self, queue: str, *, now: float | None = None) -> bool:
        return self.of_queue(queue).resume_queue(queue, now=now)

    def paused_queues(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for part in self.parts:
            out.update(part.paused_queues())
        return out

    # -- cron and steps ----------------------------------------------------------------------------
    def cron_enqueue(self, schedule: str, tick: float, job: NewJob | None, *,
                     now: float | None = None) -> EnqueueResult | None:
        self._check_count()
        part = self.parts[0] if job is None else self.of_queue(job.queue)
        return part.cron_enqueue(schedule, tick, job, now=now)

    def cron_ticks(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for part in self.parts:
            for name, tick in part.cron_ticks().items():
                out[name] = max(tick, out.get(name, tick))
        return out

    def set_cron_enabled(self, schedule: str, enabled: bool, *,
                         now: float | None = None) -> bool:
        at = self.parts[0].now() if now is None else now  # one time in every partition
        changed = [part.set_cron_enabled(schedule, enabled, now=at) for part in self.parts]
        return any(changed)

    def cron_states(self) -> dict[str, CronState]:
        out: dict[str, CronState] = {}
        for part in self.parts:
            for name, st in part.cron_states().items():
                seen = out.get(name)
                if seen is None:
                    out[name] = st
                    continue
                newer = (st.last_tick or 0) > (seen.last_tick or 0)
                last, other = (st, seen) if newer else (seen, st)
                out[name] = CronState(
                    name=name, last_tick=last.last_tick,
                    last_job_id=last.last_job_id if last.last_job_id is not None
                    else other.last_job_id,
                    disabled_at=seen.disabled_at if seen.disabled_at is not None
                    else st.disabled_at,
                    enabled_at=max((t for t in (seen.enabled_at, st.enabled_at)
                                    if t is not None), default=None))
        return out

    def record_step(self, job_id: int, step: str, result: str | None, *,
                    uid: str | None) -> tuple[bool, str | None]:
        return self.of_job(job_id).record_step(job_id, step, result, uid=uid)

    # -- life ------------------------------------------------------------------------------------
    def schema_version(self) -> int | None:
        return self.parts[0].schema_version()

    def startup_warnings(self) -> list[str]:
        return list(dict.fromkeys(w for part in self.parts for w in part.startup_warnings()))

    @property
    def closed(self) -> bool:
        return self.parts[0].closed

    def open_connections(self) -> int:
        return sum(part.open_connections() for part in self.parts)

    def close(self) -> None:
        self._hub.close()
        errors: list[StoreError] = []
        for part in self.parts:
            try:
                part.close()
            except StoreError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]


class _LoopClaims:
    """The loop claims of the partition of each claim's queue, when its acks are all of that
    partition too (a worker whose queues share one: always); otherwise the blocking call, on
    the worker's thread (LoopClaims allows any call to come back as a function)."""

    def __init__(self, owner: PartitionedRedis) -> None:
        self._owner = owner
        self._near: dict[int, LoopClaims | None] = {}

    def _of(self, acks: _Acks, queue: str) -> LoopClaims | None:
        p = queue_partition(queue, self._owner.n)
        if any(id_partition(lease.job_id) != p for lease, _ in acks):
            return None
        if p not in self._near:
            self._near[p] = self._owner.parts[p].loop_claims()
        return self._near[p]

    async def ack_and_claim(
        self, acks: _Acks, queue: str, limit: int, *, worker_id: str, lease_s: float,
        wanted: Callable[[], bool] | None = None, on_reply: Callable[[int], None] | None = None,
        start: int | None = None,
    ) -> ClaimReply | Callable[[], ClaimReply]:
        near = self._of(acks, queue)
        if near is not None:
            return await near.ack_and_claim(acks, queue, limit, worker_id=worker_id,
                                            lease_s=lease_s, wanted=wanted, on_reply=on_reply,
                                            start=start)
        owner = self._owner

        def blocking() -> ClaimReply:
            if wanted is not None and not wanted():
                return owner.ack_many(acks), []
            return owner.ack_and_claim(acks, queue, limit, worker_id=worker_id,
                                       lease_s=lease_s, start=start)

        return blocking

    def claim_ahead(self, acks: _Acks, queue: str, limit: int, *, worker_id: str,
                    lease_s: float) -> Any:
        near = self._of(acks, queue)
        if near is None:
            return None
        ahead = near.claim_ahead(acks, queue, limit, worker_id=worker_id, lease_s=lease_s)
        return None if ahead is None else (near, ahead)

    async def finish(self, ahead: Any, on_reply: Callable[[int], None] | None = None,
                     ) -> ClaimReply | Callable[[], ClaimReply]:
        near, inner = ahead
        got: ClaimReply | Callable[[], ClaimReply] = await near.finish(inner, on_reply=on_reply)
        return got

    def close(self) -> None:
        for near in self._near.values():
            if near is not None:
                near.close()
        self._near.clear()


__all__ = ["MAX_PARTITIONS", "PartitionedRedis", "id_partition", "partitions_of",
           "queue_partition"]
