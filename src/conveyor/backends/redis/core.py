"""What every part of the Redis backend stands on: its transport and keys, running a script
with the queue blocks it needs, the cache of each job's queue, closing, and store-wide locks.

RedisBackend (backend.py) is this with the mixins of enqueue.py, settle.py, maintenance.py and
admin.py, each of which builds on RedisCore only.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any, cast

from ...errors import StoreError
from ...job import Job
from .. import forking
from ..base import Backend, StoreLock, check_lock_name
from .cluster import slot_of
from .codec import _to_job
from .keys import Keys
from .transport import Transport, parse_redis_url

MAX_CACHED_QUEUES = 100_000


class RedisCore(Backend):
    def __init__(self, url: str, *, partition: int | None = None) -> None:
        self.url = url
        self.prefix, redis_url, timeouts = parse_redis_url(url)
        if partition is not None:  # one partition of a partitioned app (partitions.py)
            self.prefix = f"{self.prefix}#{partition}"
        self._redis_url = redis_url
        self._transport = Transport(url, redis_url, timeouts, slot=slot_of(self.prefix))
        self._where = self._transport.where
        self.socket_timeout = self._transport.socket_timeout
        self.keys = Keys(self.prefix)
        self._locks: set[_KeyLock] = set()  # store-wide locks this backend holds (try_lock)
        self._locks_mutex = threading.Lock()
        self._known_queues: list[str] = []
        self._id = uuid.uuid4().hex
        self._queue_of: dict[int, str] = {}
        self._one_keys: dict[str, list[str]] = {}  # enqueue_one's keys per queue
        # Claimed jobs' constructors per kind of job (RedisBackend._claimed).
        self._makers: dict[tuple[str, ...], Callable[..., Job]] = {}
        self._swept = False  # this backend saw the store marked as indexed (or swept it)
        self._sweep_at = 0  # where in the queue list the next reap's sweep slice starts
        self._done_swept = False  # as _swept, for the finished jobs' index (P:done:<state>)
        self._prune_at = 0  # where in the queue list the next prune's slice starts
        self._unsure: dict[int, str] = {}  # job id -> lease token of a settle left unanswered
        # queue -> (time.monotonic() of a claim that found it empty, seconds from then until its
        # earliest scheduled job is due, or None): what an idle wait's look would say, known
        # without one (RedisBackend._looked).
        self._emptied: dict[str, tuple[float, float | None]] = {}
        self._wake_lock = threading.Lock()
        self._wake_gen = 0
        self._waiters = 0
        self._private_wake = self.keys.private_wake(uuid.uuid4().hex)
        forking.register(self)

    # -- running scripts ------------------------------------------------------------------
    def _script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """One script call: its reply, or its error reply raised (Transport.script)."""
        return self._transport.script(name, keys, args)

    def _run(self, name: str, queues: Sequence[str], args: Sequence[Any], *, safe: bool,
             all_queues: bool = False) -> Any:
        """Run script ``name`` with the blocks of ``queues``; answer its 'need' and 'stale'
        replies."""
        qs = list(dict.fromkeys(queues))
        for _ in range(8):
            keys = list(self.keys.header)
            for q in qs:
                keys += self.keys.block(q)
            argv = [len(qs), *qs, *args]
            res = self._transport.call(name.partition(":")[0],
                                       functools.partial(self._script, name, keys, argv), safe=safe)
            if isinstance(res, list) and res and res[0] == "need":
                qs += [q for q in res[1:] if q not in qs]
                continue
            if isinstance(res, list) and res and res[0] == "stale":
                qs = self._refresh_queues()
                continue
            if all_queues:
                self._known_queues = qs
            return res
        raise StoreError(f"Redis at {self._where}: {name} kept finding new queues; try again")

    def _refresh_queues(self) -> list[str]:
        members = self._transport.call(
            "list queues", lambda: self._transport.r.smembers(self.keys.queues), safe=True)
        self._known_queues = sorted(cast(Any, members))
        return list(self._known_queues)

    def _all_queues(self) -> list[str]:
        return self._known_queues or self._refresh_queues()

    # -- which queue a job is in -------------------------------------------------------------
    def _guess(self, job_ids: Sequence[int]) -> list[str]:
        """Queue blocks to send with a script on these jobs: their cached queues. A job not in
        the cache costs one more round trip (the script answers 'need' with its queue), never
        the blocks of every queue."""
        return [q for q in (self._queue_of.get(i) for i in job_ids) if q is not None]

    def _remember(self, job: Job) -> None:
        if not job.is_final:
            if len(self._queue_of) > MAX_CACHED_QUEUES:
                self._queue_of.clear()
            self._queue_of[job.id] = job.queue

    def _forget(self, job_id: int) -> None:
        self._queue_of.pop(job_id, None)

    # -- small readers ----------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._transport.closed

    @staticmethod
    def _now_arg(now: float | None) -> str:
        return "" if now is None else repr(float(now))

    def _job(self, raw: Sequence[Any]) -> Job:
        job_id, flat, errors = raw
        return _to_job(int(job_id), dict(zip(flat[::2], flat[1::2], strict=True)), errors)

    def now(self) -> float:
        sec, usec = self._transport.call("read the clock", self._transport.r.time, safe=True)
        return int(sec) + int(usec) / 1_000_000

    def open_connections(self) -> int:
        """How many connections to Redis this backend holds open now (all of its pools')."""
        return self._transport.open_connections()

    # -- life -------------------------------------------------------------------------------
    def close(self) -> None:
        if self._transport.closed:
            return
        with self._locks_mutex:
            locks, self._locks = self._locks, set()
        for held in locks:
            with contextlib.suppress(StoreError):  # else it expires after its ttl
                held.release()
        with self._wake_lock:
            self._wake_gen += 1
            self._transport.closed = True
        self._transport.disconnect_all()

    def _after_fork_in_child(self) -> None:
        # Its connections were the parent's; a wait of the parent's held the wake lock; its
        # wake key is the parent's waiters'.
        self._transport.after_fork_in_child()
        # Its store-wide locks are the parent's: their tokens are copies, an unlock here would
        # free the parent's lock.
        forking.keep_inherited(self._locks)
        self._locks, self._locks_mutex = set(), threading.Lock()
        self._wake_lock = threading.Lock()
        self._waiters = 0
        self._private_wake = self.keys.private_wake(uuid.uuid4().hex)
        self._emptied = {}  # the parent's claims: this process looks for itself

    # -- store-wide locks ---------------------------------------------------------------------
    def try_lock(self, name: str, *, ttl: float) -> StoreLock | None:
        """A key holding this holder's random token (``SET NX PX`` in a script), expiring after
        ``ttl`` unless renewed: a holder that dies frees it within ``ttl``."""
        held = _KeyLock(self, self.keys.lock(check_lock_name(name)), uuid.uuid4().hex, ttl)
        if not held.take(first=True):
            return None
        with self._locks_mutex:
            self._locks.add(held)
        return held

    def _lock_call(self, script: str, key: str, args: Sequence[Any]) -> int:
        run = self._transport.bare_scripts[script]
        return int(self._transport.call(f"{script} {key}", lambda: run(keys=[key], args=list(args)),
                                        safe=True))


class _KeyLock(StoreLock):
    """A lock key holding this holder's token (see lock.lua and unlock.lua)."""

    def __init__(self, owner: RedisCore, key: str, token: str, ttl: float) -> None:
        self._owner = owner
        self._key = key
        self._token = token
        self._ttl_ms = max(1, int(ttl * 1000))
        self._held = False

    def take(self, *, first: bool) -> bool:
        args = [self._token, self._ttl_ms, "1" if first else "0"]
        self._held = self._owner._lock_call("lock", self._key, args) == 1
        return self._held

    def renew(self) -> bool:
        return self._held and self.take(first=False)

    def release(self) -> None:
        with self._owner._locks_mutex:
            self._owner._locks.discard(self)
        if self._held:
            self._held = False
            self._owner._lock_call("unlock", self._key, [self._token])
