"""The Redis backend: one Lua script per state transition, keys that fit one Cluster slot.

``redis://[[user]:password@]host[:port][/db][?prefix=NAME]`` (``rediss://`` for TLS). All keys
of one app start with ``{NAME}:`` (default ``conveyor``); the braces are the Cluster hash tag.
The key layout and the scripts are described in docs/redis.md and at the top of
``lua/_common.lua``.

Every call has a socket timeout. Connection failures become :class:`StoreUnavailable`.
Reads and idempotent writes are retried for a short while; a write that is not idempotent
(enqueue, claim, cancel, ...) is retried only when the failure came before the command was
sent, because a reply lost in flight does not tell whether the script ran.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import json
import logging
import math
import re
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from importlib import resources
from types import MappingProxyType
from typing import Any, NoReturn, TypeVar, cast
from urllib.parse import parse_qsl, urlencode, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.retry import Retry

from ..errors import (
    ClaimLost,
    ConfigurationError,
    InvalidName,
    JobNotFound,
    LeaseLost,
    PayloadError,
    QueueFull,
    StorageFull,
    StoreError,
    StoreUnavailable,
)
from ..job import Job, JobState, fast_constructor, make_job
from ..payload import NAME_RE
from . import forking
from .base import (
    CLAIM_SCAN,
    MAX_STALLS,
    Backend,
    EnqueueResult,
    ErrorInfo,
    Lease,
    LoopClaims,
    NewJob,
    Page,
    QueueStats,
    ReapResult,
    Stats,
    StoreLock,
    WorkerInfo,
    check_claim_id,
    check_lock_name,
    new_claim_id,
    new_uids,
    queue_full,
)

try:
    from hiredis import pack_command as _hiredis_pack_command

    def _pack(conn: Any, command: tuple[Any, ...]) -> list[Any]:
        return [_hiredis_pack_command(command)]
except ImportError:  # hiredis comes with the redis extra; redis-py's own packer otherwise
    def _pack(conn: Any, command: tuple[Any, ...]) -> list[Any]:
        return list(conn.pack_command(*command))

T = TypeVar("T")
log = logging.getLogger("conveyor.redis")

_ScriptCall = tuple[str, Sequence[str], Sequence[Any]]  # script name, keys, args

PREFIX_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
STATES = ("scheduled", "available", "running", "succeeded", "dead", "cancelled")
QUEUE_KEYS = ("available", "scheduled", "running", "succeeded", "dead", "cancelled", "jobs", "wake", "fair", "due",
              "inbox")
# At maxmemory (noeviction), Redis refuses a script without allow-oom before it runs. New work
# (enqueue, and cron ticks, which use the enqueue script) is refused so. Claiming, finishing and
# pruning must go on, or a full Redis could never drain: they run with allow-oom, and what they
# write is a few fields per job, except the texts callers hand them. An ack's result is written
# whatever its size (a refused ack runs the job again). A step record or an error bigger than
# OOM_SLACK goes by the ':strict' copy of its script (without allow-oom): refused at maxmemory,
# a step record fails its attempt with StorageFull (nothing written); an error is written again
# cut to OOM_SLACK by the allow-oom script, so a retry or kill still happens (see _settle_error).
GROWING_SCRIPTS = {"enqueue", "enqueue_one"}
STRICT_SCRIPTS = ("record_step", "retry", "kill")
OOM_SLACK = 1024  # bytes of caller text a script may write past maxmemory
# Scripts that do without _common.lua's prelude (its header of 20 keys, the queue blocks, and
# its helpers made on every call): only _core.lua comes before them.
LEAN_SCRIPTS = {"enqueue_one", "get"}
BARE_SCRIPTS = ("lock", "unlock")  # store-wide locks (try_lock): their own key, no helpers
# The last_outcome a settle of each kind leaves on the job (with its token as last_token).
_SETTLED_AS = {"ack": ("succeeded",), "kill": ("dead",), "retry": ("scheduled", "available", "dead")}
STEP_PREFIX = "step:"  # a step record is the field step:<name> of the job's hash
# The fields whose values a claim returns in this order for a job that has no others (BASE in
# claim.lua); a job with others comes back as its hash's field, value pairs instead.
_CLAIM_BASE = ("task", "args", "priority", "run_at", "attempt", "max_attempts", "timeout_s", "meta", "created_at",
               "uid")

DEFAULT_SOCKET_TIMEOUT = 5.0
DEFAULT_CONNECT_TIMEOUT = 2.0
RETRY_BUDGET = 2.0  # seconds a retryable call keeps trying before it reports the store down
WAIT_SLICE = 1.0  # longest single BLPOP; the socket timeout of waiters is this plus the normal one
# Most jobs one enqueue script call writes. Redis runs one script at a time and every other
# client waits meanwhile (heartbeats too): a 50,000-job batch in one script held it for 1.7 s.
ENQUEUE_CHUNK = 1000
LIST_BUDGET = 20_000  # ids one list_jobs call looks at before it hands back a cursor
BATCH = 1000  # jobs one redrive/purge script handles, so a big DLQ never blocks Redis for long
MAX_CACHED_QUEUES = 100_000
# Queues one sweep call looks at (see sweep.lua): the first sweep of an unindexed store goes
# round all of them in calls of this many; after it, each reap sweeps one such slice, so a
# lease that only a queue's own ZSET knows (written by an older version) is found within a round.
SWEEP_QUEUES = 200
SWEEP_PER_REAP = 20
CLOCK_MARGIN_S = 5.0  # how far past its own clock the client looks for due entries (see _due_bound)
# A connection of _send_scripts idle this long is closed, all but the most recently used: a burst
# of calls from several threads (a worker waking from a pause, a producer's request spike) made
# one each, and they would otherwise stay open for the process's life. The one kept serves a
# quiet producer without a handshake per call; a burst that comes back pays one per extra thread.
IDLE_CLOSE_S = 2.0


# No CLIENT SETINFO on connect (see RedisBackend.__init__): redis-py 7+ takes driver_info=None;
# before that, lib_name and lib_version None (deprecated since).
_NO_LIB_INFO: dict[str, None] = (
    {"driver_info": None} if "driver_info" in inspect.signature(redis.connection.AbstractConnection.__init__).parameters
    else {"lib_name": None, "lib_version": None}
)

# redis-py 8's cluster maintenance notifications (a CLIENT command per new RESP3 connection).
_NO_MAINT_NOTIFICATIONS: dict[str, Any] = {}
try:
    from redis.maint_notifications import MaintNotificationsConfig
except ImportError:  # redis-py before 7
    pass
else:
    _NO_MAINT_NOTIFICATIONS["maint_notifications_config"] = MaintNotificationsConfig(enabled=False)


class _NotSent(redis.ConnectionError):
    """Connecting failed: the command was never sent, so retrying it cannot run it twice."""


class _ConnectMixin:
    idle_since = 0.0  # monotonic time it was last handed back to its idle stack (_send_scripts)

    def connect(self) -> None:
        try:
            super().connect()  # type: ignore[misc]
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if isinstance(exc, _NotSent | redis.AuthenticationError | redis.exceptions.AuthorizationError):
                raise  # a wrong password is not worth retrying
            raise _NotSent(str(exc)) from exc


class _Connection(_ConnectMixin, redis.Connection):
    pass


class _SSLConnection(_ConnectMixin, redis.SSLConnection):
    pass


def parse_redis_url(url: str) -> tuple[str, str, dict[str, float]]:
    """Split our own options (``prefix``, timeouts) off the URL; the rest goes to redis-py."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        raise ConfigurationError(f"not a redis URL: {_redact(url)!r}")
    prefix = "conveyor"
    timeouts = {"socket_timeout": DEFAULT_SOCKET_TIMEOUT, "socket_connect_timeout": DEFAULT_CONNECT_TIMEOUT}
    rest: list[tuple[str, str]] = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key == "prefix":
            prefix = value
        elif key in timeouts:
            try:
                timeouts[key] = float(value)
            except ValueError:
                raise ConfigurationError(f"{_redact(url)!r}: {key} must be a number of seconds") from None
            if not (timeouts[key] > 0 and math.isfinite(timeouts[key])):
                raise ConfigurationError(f"{_redact(url)!r}: {key} must be > 0 seconds")
        else:
            rest.append((key, value))
    if not PREFIX_RE.fullmatch(prefix):
        raise ConfigurationError(
            f"{_redact(url)!r}: prefix must be 1-64 characters from A-Z a-z 0-9 _ . : -, got {prefix!r}"
        )
    return prefix, parts._replace(query=urlencode(rest)).geturl(), timeouts


def _redact(url: str) -> str:
    from . import redact_url

    return redact_url(url)


class _Keys:
    def __init__(self, prefix: str) -> None:
        p = "{" + prefix + "}"
        self.p = p
        self.job_prefix, self.all_jobs = f"{p}:job:", f"{p}:jobs"
        self.queues, self.ids, self.cron = f"{p}:queues", f"{p}:ids", f"{p}:cron"
        self.header = [
            self.job_prefix, f"{p}:errors:", self.all_jobs, *(f"{p}:state:{s}" for s in STATES),
            f"{p}:unique", f"{p}:expiries", self.queues, self.ids, f"{p}:workers", f"{p}:seen",
            self.cron, f"{p}:conc:", f"{p}:rate:", f"{p}:leases", f"{p}:schedule",
        ]
        # Set once every queue's own running and scheduled ZSETs were swept into the global
        # ones (P:leases, P:schedule): a store written before those existed has no such key.
        self.leases, self.schedule = f"{p}:leases", f"{p}:schedule"
        self.indexed = f"{p}:indexed"
        self.maintenance = f"{p}:lock:maintenance"

    def job(self, job_id: int) -> str:
        return f"{self.p}:job:{job_id}"

    def errors(self, job_id: int) -> str:
        return f"{self.p}:errors:{job_id}"

    def queue(self, queue: str, what: str) -> str:
        return f"{self.p}:q:{queue}:{what}"

    def block(self, queue: str) -> list[str]:
        return [self.queue(queue, what) for what in QUEUE_KEYS]

    def state(self, state: str) -> str:
        return f"{self.p}:state:{state}"


def _load_script(name: str) -> str:
    """The text of script ``name``; ``<name>:strict`` is that script without allow-oom."""
    name, _, strict = name.partition(":")
    folder = resources.files(__package__).joinpath("lua")
    if name in BARE_SCRIPTS:  # one key of their own: none of the store's helpers
        return "#!lua flags=allow-oom\n" + folder.joinpath(f"{name}.lua").read_text("utf-8")
    common = folder.joinpath("_core.lua").read_text("utf-8")
    if name not in LEAN_SCRIPTS:
        common += "\n" + folder.joinpath("_common.lua").read_text("utf-8")
    body = folder.joinpath(f"{name}.lua").read_text("utf-8")
    # A shebang makes Redis 7 check the script's flags before it runs: a script that grows the
    # store is refused whole at maxmemory instead of failing at its first write, half-done.
    # No script is no-writes: even the readers (stats, list_jobs, peek) fold the inboxes of
    # the queues they are given into their indexes first (fold_inbox in _core.lua).
    shebang = "#!lua" if name in GROWING_SCRIPTS or strict else "#!lua flags=allow-oom"
    return f"{shebang}\n{common}\n{body}"


SCRIPT_NAMES = (
    "enqueue", "enqueue_one", "claim", "heartbeat", "ack", "ack_many", "retry", "kill", "release", "reap", "promote", "prune",
    "cancel", "redrive", "purge", "record_worker", "remove_worker", "stats", "list_jobs", "record_step", "peek", "get",
    "sweep",
    *(f"{name}:strict" for name in STRICT_SCRIPTS),
)


def _exposure_warnings(redis_url: str, where: str) -> list[str]:
    """A Redis off this machine reached without TLS or without credentials: anyone on the path
    can read the jobs, and anyone who can connect can change or delete them."""
    parts = urlsplit(redis_url)
    host = (parts.hostname or "localhost").lower()
    if host in ("localhost", "::1") or host.startswith("127.") or parts.scheme == "unix":
        return []
    found = []
    if parts.scheme != "rediss":
        found.append(f"Redis at {where} is reached without TLS: job arguments and results cross the network "
                     "in clear. Use rediss:// (see docs/security.md).")
    if not parts.password:
        found.append(f"Redis at {where} is reached without a password: anyone who can connect to it can read, "
                     "change or delete jobs. Use an ACL user with a password (redis://user:pass@host).")
    return found


class RedisBackend(Backend):
    def __init__(self, url: str) -> None:
        self.url = url
        self.prefix, redis_url, timeouts = parse_redis_url(url)
        self._where = _redact(redis_url)
        self._redis_url = redis_url
        self.keys = _Keys(self.prefix)
        self.socket_timeout = timeouts["socket_timeout"]
        tls = urlsplit(redis_url).scheme == "rediss"
        common: dict[str, Any] = {
            "socket_connect_timeout": timeouts["socket_connect_timeout"],
            "socket_keepalive": True,
            "decode_responses": True,
            # Retries are ours (see _call): redis-py's would resend a script whose reply was lost.
            "retry": Retry(NoBackoff(), 0),
            "connection_class": _SSLConnection if tls else _Connection,
            "max_connections": 1024,
            "client_name": "conveyor",
            # A new connection's handshake is round trips before the first command, and a call
            # that needs a connection pays them within its own time bound. No CLIENT SETINFO (two,
            # refused by Redis before 7.2) and no CLIENT MAINT_NOTIFICATIONS (redis-py 8 with
            # RESP3; refused before Redis 8): HELLO (RESP3) and SETNAME are left.
            **_NO_LIB_INFO,
            **_NO_MAINT_NOTIFICATIONS,
        }
        try:
            self._pool = redis.ConnectionPool.from_url(redis_url, socket_timeout=self.socket_timeout, **common)
            # Idle workers block in BLPOP for up to WAIT_SLICE: their reads need a longer timeout.
            self._block_pool = redis.ConnectionPool.from_url(
                redis_url, socket_timeout=WAIT_SLICE + self.socket_timeout, **common
            )
        except ValueError as exc:
            raise ConfigurationError(f"{_redact(url)!r}: {exc}") from None
        self._r = redis.Redis(connection_pool=self._pool)
        self._rb = redis.Redis(connection_pool=self._block_pool)
        self._scripts: dict[str, Script] = {n: self._r.register_script(_load_script(n)) for n in SCRIPT_NAMES}
        self._lock_scripts = {n: self._r.register_script(_load_script(n)) for n in BARE_SCRIPTS}
        self._locks: set[_KeyLock] = set()  # store-wide locks this backend holds (try_lock)
        self._locks_mutex = threading.Lock()
        self._known_queues: list[str] = []
        self._id = uuid.uuid4().hex
        self._swept = False  # this backend saw the store marked as indexed (or swept it)
        self._sweep_at = 0  # where in the queue list the next reap's sweep slice starts
        self._queue_of: dict[int, str] = {}
        self._one_keys: dict[str, list[str]] = {}  # enqueue_one's keys per queue
        self._wake_lock = threading.Lock()
        self._wake_gen = 0
        self._waiters = 0
        self._private_wake = f"{self.keys.p}:wake:{uuid.uuid4().hex}"
        # The connections of _send_scripts (see there) and of the loop claims: idle ones (those
        # for the idle wait's blocking pop apart, with its longer timeout), and every one made and
        # not yet closed for good, which is both the count checked against max_connections and
        # what close() shuts. They are made from the pools' connection class and settings but
        # not by the pools: a pool counts every connection it makes until the pool is reset, so
        # closing idle ones used its cap up over a process's life.
        self._idle: list[Any] = []
        self._idle_blocking: list[Any] = []
        self._made: set[Any] = set()
        self._made_lock = threading.Lock()
        self._unsure: dict[int, str] = {}  # job id -> lease token of a settle left unanswered
        self._max_connections = int(self._pool.max_connections)
        self._closed = False
        forking.register(self)

    # -- plumbing -----------------------------------------------------------------------
    def _call(self, what: str, fn: Callable[[], T], *, safe: bool) -> T:
        """Run ``fn`` with our retry policy and error translation.

        ``safe``: running it twice does no harm (reads, idempotent writes, fenced writes).
        Otherwise only failures before sending are retried.
        """
        if self._closed:
            raise StoreError("this backend is closed")
        deadline = time.monotonic() + RETRY_BUDGET
        pause = 0.02
        sent = False  # a try failed after its command may have gone out
        while True:
            try:
                return fn()
            except (redis.AuthenticationError, redis.exceptions.AuthorizationError) as exc:
                raise StoreError(
                    f"Redis at {self._where} refused the credentials: {what} failed ({exc}); "
                    "check the user and password in the URL"
                ) from exc
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                unsent = isinstance(exc, _NotSent | redis.BusyLoadingError | redis.exceptions.MaxConnectionsError)
                sent = sent or not unsent
                if (safe or unsent) and not self._closed and time.monotonic() + pause < deadline:
                    time.sleep(pause)
                    pause = min(pause * 2, 0.5)
                    continue
                if not sent:
                    detail = "nothing was done"
                elif safe:
                    # (The last try may have failed to connect: an earlier one was sent.)
                    detail = "a reply was lost, so it may or may not have happened; it is safe to try again"
                else:
                    detail = "the reply was lost, so it may or may not have happened"
                raise StoreUnavailable(f"Redis at {self._where} is unreachable: {what} failed ({exc}); {detail}") from exc
            except redis.ResponseError as exc:
                text = str(exc)
                if isinstance(exc, redis.exceptions.OutOfMemoryError) or text.startswith("OOM") or "maxmemory" in text:
                    raise StorageFull(
                        f"Redis at {self._where} is out of memory (maxmemory): {what} refused, nothing was written"
                    ) from exc
                if text.startswith("MISCONF"):
                    # Redis refuses writes while it cannot write its AOF or RDB file (a full
                    # disk, most often), before running the script: nothing was written.
                    raise StorageFull(
                        f"Redis at {self._where} cannot persist ({text}): {what} refused, nothing was "
                        "written; free disk space where Redis keeps its files, and it resumes by itself"
                    ) from exc
                if isinstance(exc, redis.ReadOnlyError):
                    text += " (this server is a read-only replica: point the URL at the primary)"
                elif isinstance(exc, redis.exceptions.NoPermissionError):
                    text += " (the ACL user needs the scripting, hash, list, set, sorted set and string commands)"
                raise StoreError(f"Redis at {self._where}: {what} failed: {text}") from exc
            except redis.RedisError as exc:
                raise StoreError(f"Redis at {self._where}: {what} failed: {exc}") from exc
            except UnicodeEncodeError as exc:
                raise PayloadError(f"{what}: a value is not valid UTF-8 text ({exc}); nothing was written") from exc
            except Exception as exc:
                if self._closed:  # close() pulled the socket from under this call (redis-py then fails oddly)
                    raise StoreError(f"this backend is closed: {what} was cut short ({exc!r})") from exc
                raise

    def _run(self, name: str, queues: Sequence[str], args: Sequence[Any], *, safe: bool,
             all_queues: bool = False) -> Any:
        """Run script ``name`` with the blocks of ``queues``; answer its 'need' and 'stale' replies."""
        qs = list(dict.fromkeys(queues))
        for _ in range(8):
            keys = list(self.keys.header)
            for q in qs:
                keys += self.keys.block(q)
            argv = [len(qs), *qs, *args]
            res = self._call(name.partition(":")[0], functools.partial(self._script, name, keys, argv), safe=safe)
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
        members = self._call("list queues", lambda: self._r.smembers(self.keys.queues), safe=True)
        self._known_queues = sorted(members)  # type: ignore[arg-type]
        return list(self._known_queues)

    def _all_queues(self) -> list[str]:
        return self._known_queues or self._refresh_queues()

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

    @property
    def closed(self) -> bool:
        return self._closed

    @staticmethod
    def _now_arg(now: float | None) -> str:
        return "" if now is None else repr(float(now))

    def _job(self, raw: Sequence[Any]) -> Job:
        job_id, flat, errors = raw
        return _to_job(int(job_id), dict(zip(flat[::2], flat[1::2], strict=True)), errors)

    def now(self) -> float:
        sec, usec = self._call("read the clock", self._r.time, safe=True)
        return int(sec) + int(usec) / 1_000_000

    def close(self) -> None:
        if self._closed:
            return
        with self._locks_mutex:
            locks, self._locks = self._locks, set()
        for held in locks:
            with contextlib.suppress(StoreError):  # else it expires after its ttl
                held.release()
        with self._wake_lock:
            self._wake_gen += 1
            self._closed = True
        # Disconnecting shuts the waiters' sockets down, which ends their BLPOP at once.
        self._pool.disconnect()
        self._block_pool.disconnect()
        for conn in list(self._made):
            conn.disconnect()

    def try_lock(self, name: str, *, ttl: float) -> StoreLock | None:
        """A key holding this holder's random token (``SET NX PX`` in a script), expiring after
        ``ttl`` unless renewed: a holder that dies frees it within ``ttl``."""
        held = _KeyLock(self, f"{self.keys.p}:lock:{check_lock_name(name)}", uuid.uuid4().hex, ttl)
        if not held.take(first=True):
            return None
        with self._locks_mutex:
            self._locks.add(held)
        return held

    def _lock_call(self, script: str, key: str, args: Sequence[Any]) -> int:
        run = self._lock_scripts[script]
        return int(self._call(f"{script} {key}", lambda: run(keys=[key], args=list(args)), safe=True))

    # -- producer -------------------------------------------------------------------------
    def enqueue_many(self, jobs: Sequence[NewJob], *, now: float | None = None) -> list[EnqueueResult]:
        """Up to ENQUEUE_CHUNK jobs: one atomic script, all or nothing. A bigger batch is every
        job checked first (a bad one anywhere writes nothing), then written ENQUEUE_CHUNK jobs
        per script, in order, each chunk all or nothing, so Redis is never held for long. A
        chunk that fails (QueueFull, StorageFull, StoreUnavailable) leaves the chunks before it
        written, and the error says how many jobs that is. Ids increase in batch order; another
        producer's jobs may come between two chunks."""
        if not jobs:
            return []
        if len(jobs) <= ENQUEUE_CHUNK:
            res = self._enqueue(jobs, "", 0.0, now)
            assert res is not None
            return res
        for n, job in enumerate(jobs):
            _validate(job, n)
        done: list[EnqueueResult] = []
        for start in range(0, len(jobs), ENQUEUE_CHUNK):
            try:
                res = self._enqueue(jobs[start:start + ENQUEUE_CHUNK], "", 0.0, now)
            except (QueueFull, StoreError) as exc:
                if not done:
                    raise
                raise _partly_written(exc, len(done), len(jobs)) from exc
            assert res is not None
            done += res
        return done

    def _enqueue(self, jobs: Sequence[NewJob], cron: str, tick: float, now: float | None) -> list[EnqueueResult] | None:
        """Run the enqueue script; with a cron schedule name, only if it takes that tick (None if not)."""
        if not cron and len(jobs) == 1 and _plain(jobs[0]):
            return [self._enqueue_one(jobs[0], now)]
        args: list[Any] = [self._now_arg(now), cron, repr(float(tick))]
        uids = new_uids(len(jobs))
        for n, job in enumerate(jobs):
            _validate(job, n)
            args += [uids[n],
                job.queue, job.task, job.args, str(job.priority), repr(float(job.delay)),
                "" if job.run_at is None else repr(float(job.run_at)), str(job.max_attempts),
                repr(float(job.timeout)), "0" if job.unique_key is None else "1", job.unique_key or "",
                job.meta, "" if job.max_depth is None else str(int(job.max_depth)),
                "" if job.unique_for is None else repr(float(job.unique_for)),
                "0" if job.fair_key is None else "1", job.fair_key or "",
                job.concurrency_key or "", "" if job.concurrency_limit is None else str(job.concurrency_limit),
                job.rate_key or "", "" if job.rate_limit is None else str(job.rate_limit),
                "" if job.rate_period is None else repr(float(job.rate_period)),
            ]
        res = self._run("enqueue", [j.queue for j in jobs], args, safe=False)
        if res and res[0] == "full":
            raise queue_full(str(res[1]), int(res[2]), int(res[3]))
        if res and res[0] == "taken":
            return None
        at = float(res[0])
        results = []
        for n, i in enumerate(range(1, len(res), 2)):
            created = bool(int(res[i + 1]))
            results.append(EnqueueResult(int(res[i]), created, at, uids[n] if created else None))
        return results

    def _enqueue_one(self, job: NewJob, now: float | None) -> EnqueueResult:
        """One plain job (see _plain) by enqueue_one.lua, which writes what the enqueue script
        would with a tenth of its work: most enqueues are one such job, each a round trip."""
        _validate(job, 0)
        keys = self._one_keys.get(job.queue)
        if keys is None:
            k = self.keys
            keys = [k.job_prefix, k.all_jobs, k.state("available"), k.queues, k.ids,
                    *(k.queue(job.queue, what) for what in ("available", "jobs", "wake", "fair", "due", "inbox"))]
            if len(self._one_keys) > MAX_CACHED_QUEUES:
                self._one_keys.clear()
            self._one_keys[job.queue] = keys
        [uid] = new_uids(1)
        args = [self._now_arg(now), job.queue, job.task, job.args, str(job.priority), str(job.max_attempts),
                repr(float(job.timeout)), job.meta, uid]
        res = self._call("enqueue", functools.partial(self._script, "enqueue_one", keys, args), safe=False)
        return EnqueueResult(int(res[1]), True, float(res[0]), uid)

    def cron_enqueue(self, schedule: str, tick: float, job: NewJob | None, *,
                     now: float | None = None) -> EnqueueResult | None:
        if not isinstance(schedule, str) or not schedule:
            raise ValueError(f"cron schedule name must be a non-empty str, got {schedule!r}")
        if isinstance(tick, bool) or not isinstance(tick, int | float) or not math.isfinite(tick):
            raise ValueError(f"cron tick must be a finite unix time, got {tick!r}")
        res = self._enqueue([] if job is None else [job], schedule, float(tick), now)
        return res[0] if res else None

    def cron_ticks(self) -> dict[str, float]:
        ticks = self._call("read cron ticks", lambda: self._r.hgetall(self.keys.cron), safe=True)
        return {str(name): float(tick) for name, tick in ticks.items()}

    def record_step(self, job_id: int, step: str, result: str | None, *, uid: str | None) -> tuple[bool, str | None]:
        if not isinstance(step, str) or not NAME_RE.fullmatch(step):
            raise InvalidName(f"step name must match {NAME_RE.pattern}, got {step!r}")
        if result is not None and not isinstance(result, str):
            raise PayloadError(f"the result of step {step!r} must be JSON text, got {type(result).__name__}")
        # Safe to resend: HSETNX changes nothing the second time, and the answer is the stored text.
        text = "null" if result is None else result
        name = "record_step" if len(text) <= OOM_SLACK else "record_step:strict"  # (see STRICT_SCRIPTS)
        res = self._run(name, [], [int(job_id), step, text, uid or ""], safe=True)
        if res[0] == "missing":
            raise JobNotFound(f"no job with id {job_id}")
        if res[0] == "other":
            raise JobNotFound(f"no job with id {job_id} and uid {uid}: the id now names another job "
                              "(the store lost data and counted its ids again)")
        stored = str(res[2])
        return bool(int(res[1])), None if stored == "null" else stored

    # -- worker ---------------------------------------------------------------------------
    def claim(
        self, queue: str, limit: int, *, worker_id: str, lease_s: float, now: float | None = None,
        start: int | None = None, claim_id: str | None = None,
    ) -> list[Job]:
        claim_id = new_claim_id() if claim_id is None else check_claim_id(claim_id)
        if limit <= 0:
            return []
        tokens = _tokens(limit, claim_id)
        try:
            res = self._run("claim", [queue], [self._now_arg(now), limit, repr(float(lease_s)), worker_id, CLAIM_SCAN,
                                               _start_arg(start, limit), *tokens], safe=False)
        except StoreUnavailable:
            self._give_back_lost_claim(queue, claim_id, now)
            raise
        return self._claimed(res, queue, worker_id, tokens)

    def release_claim(self, queue: str, claim_id: str, *, now: float | None = None) -> list[int]:
        check_claim_id(claim_id)
        running_key = self.keys.queue(queue, "running")

        def tokens() -> list[tuple[int, str | None]]:
            ids = [int(i) for i in cast(list[str], self._r.zrange(running_key, 0, -1))]
            pipe = self._r.pipeline(transaction=False)
            for job_id in ids:
                pipe.hget(self.keys.job(job_id), "lease_token")
            return list(zip(ids, pipe.execute(), strict=True))

        found = self._call("find a claim's leases", tokens, safe=True)
        leases = [Lease(job_id, token) for job_id, token in found if token is not None and token[:24] == claim_id]
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

    def _claimed(self, res: list[Any], queue: str, worker_id: str, tokens: list[str]) -> list[Job]:
        """The jobs of a claim script's reply, with the fields it leaves out put back."""
        if not res or res[0] == "hold":  # (limits hold every waiting job back: see claim.lua)
            return []
        at, expires = res[0], res[1]
        known = {"queue": queue, "state": "running", "attempted_at": at, "worker_id": worker_id,
                 "lease_expires_at": expires}
        jobs = []
        makers: dict[tuple[str, ...], Callable[..., Job]] = {}
        for (job_id, base, extra, errors), token in zip(res[2:], tokens, strict=False):
            h = dict(zip(_CLAIM_BASE, base, strict=True)) if base else {}
            if extra or errors or not base:
                h.update(zip(extra[::2], extra[1::2], strict=True))
                h.update(known, lease_token=token)
                job = _to_job(int(job_id), h, errors)
                self._remember(job)
            else:
                # A job with nothing but the fields every job has (most are): what it shares with
                # the claim's other jobs of the same kind goes into one constructor per claim.
                kind = (h["task"], h["priority"], h["max_attempts"], h["timeout_s"])
                make = makers.get(kind)
                if make is None:
                    make = makers[kind] = fast_constructor(Job, {
                        "task": kind[0], "queue": queue, "state": JobState.RUNNING, "priority": int(kind[1]),
                        "max_attempts": int(kind[2]), "timeout": float(kind[3]), "attempted_at": float(at),
                        "worker_id": worker_id, "lease_expires_at": float(expires),
                    })
                raw_meta = h["meta"]
                job = make(id=int(job_id), args=json.loads(h["args"]), attempts=int(h["attempt"]),
                           run_at=float(h["run_at"]), created_at=float(h["created_at"]), uid=h["uid"], lease_token=token,
                           **({} if raw_meta == "{}" else {"meta": json.loads(raw_meta)}))
                self._queue_of[job.id] = queue  # (_remember: a claimed job is not final)
            jobs.append(job)
        if len(self._queue_of) > MAX_CACHED_QUEUES:
            self._queue_of.clear()
        return jobs

    def heartbeat(self, leases: Sequence[Lease], *, lease_s: float, now: float | None = None,
                  held: Collection[int] = ()) -> set[int]:
        if not leases:
            return set()
        args: list[Any] = [self._now_arg(now), repr(float(lease_s))]
        for lease in leases:
            args += [lease.job_id, lease.token, "1" if lease.job_id in held else "0"]
        res = self._run("heartbeat", self._guess([lease.job_id for lease in leases]), args, safe=True)
        return {int(i) for i in res[1:]}

    def _settle(self, name: str, lease: Lease, args: Sequence[Any], now: float | None) -> list[Any]:
        """A fenced script on one job. Retried on connection errors: the fence makes a repeat
        harmless, and if the repeat is refused we look whether the first one had landed. A
        repeat may also come from the caller (the worker tries an outcome again after a
        StoreUnavailable): a lease whose last call here got no answer is in _unsure, and its
        refusal is looked at the same way, so an ack that landed unseen reports success."""
        tries = 0
        kind = name.partition(":")[0]
        unsure = self._was_unsure(lease)
        if len(self._unsure) > MAX_CACHED_QUEUES:
            self._unsure.clear()
        self._unsure[lease.job_id] = lease.token  # until an answer comes back

        def run(keys: list[str], argv: list[Any]) -> Any:
            nonlocal tries
            tries += 1
            return self._script(name, keys, argv)

        qs = self._guess([lease.job_id])
        for _ in range(4):
            keys = list(self.keys.header)
            for q in qs:
                keys += self.keys.block(q)
            argv = [len(qs), *qs, self._now_arg(now), lease.job_id, lease.token, *args]
            tries = 0
            res: list[Any] = self._call(kind, functools.partial(run, keys, argv), safe=True)
            if res[0] == "need":
                qs = [*qs, *res[1:]]
                continue
            if res[0] == "lost" and (tries > 1 or unsure):  # resent after a connection error
                last = self._call("check", lambda: self._r.hmget(self.keys.job(lease.job_id),
                                                                  ["last_token", "last_outcome"]), safe=True)
                if last[0] == lease.token and last[1] in _SETTLED_AS[kind]:
                    res = ["ok", last[1]]
            self._unsure.pop(lease.job_id, None)
            self._forget(lease.job_id)
            return res
        raise StoreError(f"Redis at {self._where}: {name} could not find the queue of job {lease.job_id}")

    def ack(self, lease: Lease, result: str | None, *, now: float | None = None) -> None:
        res = self._settle("ack", lease, ["0" if result is None else "1", result or ""], now)
        if res[0] != "ok":
            raise LeaseLost(lease.job_id, "ack refused")

    def ack_many(self, acks: Sequence[tuple[Lease, str | None]], *, now: float | None = None) -> list[bool]:
        """The batch in one ack_many script call. Anything unusual (a queue not guessed, an
        error reply, a broken connection) falls back to one careful ack each."""
        if len(acks) < 2:
            return super().ack_many(acks, now=now)
        try:
            replies = self._send_scripts([self._acks_call(acks, now)])
        except (redis.ConnectionError, redis.TimeoutError):
            replies = [None]  # it may have landed: the fallback checks each
        return self._acks_held(acks, replies[0], now)

    def ack_and_claim(
        self, acks: Sequence[tuple[Lease, str | None]], queue: str, limit: int, *,
        worker_id: str, lease_s: float, now: float | None = None, start: int | None = None,
    ) -> tuple[list[bool], list[Job]]:
        """The acks' script and the claim's in one pipelined round trip (the acks run first:
        Redis runs a connection's commands in order)."""
        if limit <= 0 or not acks:
            return super().ack_and_claim(acks, queue, limit, worker_id=worker_id, lease_s=lease_s, now=now,
                                         start=start)
        tokens = _tokens(limit)
        calls = self._claim_calls(acks, queue, limit, worker_id, lease_s, now, tokens, start)
        try:
            replies = self._send_scripts(calls)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._claims_lost(acks, exc, now, queue, tokens)
        return self._claims_done(acks, queue, limit, worker_id, lease_s, now, tokens, replies, start)

    def _claim_calls(self, acks: Sequence[tuple[Lease, str | None]], queue: str, limit: int, worker_id: str,
                     lease_s: float, now: float | None, tokens: list[str], start: int | None) -> list[_ScriptCall]:
        """The scripts of ack_and_claim: ack_many for the acks (if any), then the claim."""
        claim = ("claim", [*self.keys.header, *self.keys.block(queue)],
                 [1, queue, self._now_arg(now), limit, repr(float(lease_s)), worker_id, CLAIM_SCAN,
                  _start_arg(start, limit), *tokens])
        return [self._acks_call(acks, now), claim] if acks else [claim]

    def _claims_lost(self, acks: Sequence[tuple[Lease, str | None]], exc: Exception, now: float | None,
                     queue: str, tokens: Sequence[str]) -> NoReturn:
        """The connection broke after _claim_calls were sent: what the claim may have taken is
        given back by its claim id (or, if the store is still away, comes back when its leases
        run out); the acks are checked one by one."""
        self._give_back_lost_claim(queue, tokens[0][:24], now)
        if not acks:
            raise StoreUnavailable(f"Redis at {self._where} is unreachable: claim failed ({exc}); "
                                   "the reply was lost, so it may or may not have happened") from exc
        held = self._acks_held(acks, None, now)
        raise ClaimLost(f"Redis at {self._where} is unreachable: claim failed ({exc}); "
                        f"{sum(held)} of {len(acks)} acks written", held) from exc

    def _was_unsure(self, lease: Lease) -> bool:
        """Whether a settle of this lease got no answer before (see _settle): a refusal of it
        now may be its own landed write, to be looked at."""
        return self._unsure.get(lease.job_id) == lease.token

    def _claims_plain(self, acks: Sequence[tuple[Lease, str | None]], replies: Sequence[Any]) -> bool:
        """Whether _claims_done can read these replies without calling the store: every ack
        answered 'ok', or 'lost' when no earlier try of it went unanswered, and the claim
        answered jobs or nothing."""
        if acks:
            held = replies[0]
            if not (isinstance(held, list) and len(held) == len(acks) and all(
                    r == "ok" or (r == "lost" and not self._was_unsure(lease))
                    for r, (lease, _) in zip(held, acks, strict=True))):
                return False
        res = replies[-1]
        return isinstance(res, list) and (not res or res[0] not in ("need", "stale"))

    def _claims_done(self, acks: Sequence[tuple[Lease, str | None]], queue: str, limit: int, worker_id: str,
                     lease_s: float, now: float | None, tokens: list[str],
                     replies: Sequence[Any], start: int | None) -> tuple[list[bool], list[Job]]:
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
        return held, self.claim(queue, limit, worker_id=worker_id, lease_s=lease_s, now=now, start=start)

    def loop_claims(self) -> LoopClaims | None:
        from .redis_loop import RedisLoopClaims

        return RedisLoopClaims.make(self)

    def _acks_call(self, acks: Sequence[tuple[Lease, str | None]], now: float | None) -> _ScriptCall:
        """One ack_many call for the batch, with the blocks of every queue its jobs may be in."""
        qs: list[str] = []
        for lease, _ in acks:
            for q in self._guess([lease.job_id]):
                if q not in qs:
                    qs.append(q)
        keys = list(self.keys.header)
        for q in qs:
            keys += self.keys.block(q)
        argv: list[Any] = [len(qs), *qs, self._now_arg(now)]
        for lease, result in acks:
            argv += [lease.job_id, lease.token, "0" if result is None else "1", result or ""]
        return "ack_many", keys, argv

    def _send_scripts(self, calls: Sequence[_ScriptCall], *, first: tuple[Any, ...] | None = None) -> list[Any]:
        """EVALSHA each (script, keys, args) in one write on one pooled connection; the replies
        in order, an error reply as its exception. This is redis-py's pipeline without its
        command layer (argument checks, observability hooks, Script objects that ask SCRIPT
        EXISTS first), which cost more client time than the script took to run. Commands go
        out through the connection's send_packed_command and replies come back through its
        parser, so timeouts, reconnects and error classes are redis-py's own. On NOSCRIPT (a
        new server, a restart, a SCRIPT FLUSH) the refused scripts are loaded again; the refused
        calls did nothing, and their callers send them again or take the careful path.
        The connection comes from a list of our own rather than redis-py's pool, whose checkout
        (a lock, pid and connection-count bookkeeping, observability hooks) took 18 us of the
        ~290 us of a one-job enqueue; the one check of it that matters is kept: a connection
        the server closed is replaced before anything is sent on it.
        ``first``: a plain command sent ahead of the scripts in the same write (the idle wait's
        blocking pop, on a connection with the longer timeout); its reply comes first."""
        conn = self._checkout(blocking=first is not None)
        try:
            conn.connect()  # no-op when connected; _NotSent if it cannot
            try:
                stale = conn.can_read()  # stray data, or closed by the server (a restart, a kill)
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                stale = True
            if stale:
                # A fresh connection instead: a command sent on a dead one fails after it was
                # sent (its outcome unknown), a failed connect fails before (nothing was done).
                conn.disconnect()
                conn.connect()
            packed: list[Any] = [] if first is None else _pack(conn, first)
            for name, keys, args in calls:
                command = ("EVALSHA", self._scripts[name].sha, len(keys), *keys, *args)
                packed += _pack(conn, command)
            conn.send_packed_command(packed, check_health=False)
            replies: list[Any] = []
            if first is not None:
                head = conn.read_response()
            refused = False
            for _ in calls:
                try:
                    replies.append(conn.read_response())
                except redis.ResponseError as exc:
                    replies.append(exc)
                    refused = True
        except BaseException:
            conn.disconnect()  # replies may be left unread on it
            raise
        finally:
            self._checkin(self._idle if first is None else self._idle_blocking, conn)
        if refused:
            self._reload_refused(calls, replies)
        return replies if first is None else [head, *replies]

    def _reload_refused(self, calls: Sequence[_ScriptCall], replies: Sequence[Any]) -> None:
        """Load again the scripts the server answered NOSCRIPT to (blocking)."""
        for name in {name for (name, _, _), r in zip(calls, replies, strict=True)
                     if isinstance(r, redis.exceptions.NoScriptError)}:
            script = self._scripts[name]
            script.sha = self._call("load scripts", functools.partial(self._r.script_load, script.script),
                                    safe=True)

    def _after_fork_in_child(self) -> None:
        # Its pools held the parent's connections; a wait of the parent's held the wake lock;
        # its wake key is the parent's waiters'.
        self._drop_inherited()
        # Its store-wide locks are the parent's: their tokens are copies, an unlock here would
        # free the parent's lock.
        forking.keep_inherited(self._locks)
        self._locks, self._locks_mutex = set(), threading.Lock()
        self._pool.reset()
        self._block_pool.reset()
        self._wake_lock = threading.Lock()
        self._waiters = 0
        self._private_wake = f"{self.keys.p}:wake:{uuid.uuid4().hex}"

    def _checkout(self, *, blocking: bool = False) -> Any:
        try:
            return (self._idle_blocking if blocking else self._idle).pop()  # atomic: no lock needed
        except IndexError:
            return self._make_connection(blocking=blocking)

    def _drop_inherited(self) -> None:
        """In a forked child: forget the parent's connections (never close or talk on them:
        they are the parent's sockets too); the child makes its own. The lock is made anew: a
        parent thread may have held it at the fork."""
        self._idle, self._idle_blocking, self._made = [], [], set()
        self._made_lock = threading.Lock()

    def _make_connection(self, *, blocking: bool = False) -> Any:
        """A new connection (not connected yet), counted in _made until _discard."""
        pool = self._block_pool if blocking else self._pool
        with self._made_lock:
            if len(self._made) >= self._max_connections:
                raise redis.exceptions.MaxConnectionsError(
                    f"Too many connections: {len(self._made)} open, max_connections={self._max_connections}")
            conn = pool.connection_class(**pool.connection_kwargs)
            self._made.add(conn)
        return conn

    def _discard(self, conn: Any) -> None:
        """Close ``conn`` for good and give its place under max_connections back."""
        with self._made_lock:
            self._made.discard(conn)
        conn.disconnect()

    def open_connections(self) -> int:
        """How many connections to Redis this backend holds open now (all of its pools')."""
        pooled = []
        for pool in (self._pool, self._block_pool):
            with pool._lock:
                pooled += [*pool._available_connections, *pool._in_use_connections]
        return sum(1 for c in [*list(self._made), *pooled] if getattr(c, "_sock", None) is not None)

    def _checkin(self, stack: list[Any], conn: Any) -> None:
        """Hand ``conn`` back (to the top: the next checkout takes the most recently used),
        then close what has been idle for IDLE_CLOSE_S in either stack (see there)."""
        now = time.monotonic()
        conn.idle_since = now
        stack.append(conn)
        self._close_idle(self._idle, now)
        self._close_idle(self._idle_blocking, now)

    def _close_idle(self, stack: list[Any], now: float) -> None:
        # A stack's bottom is its longest idle: checkouts and checkins both happen at the top.
        # No lock: a connection in a stack is nobody's, and remove() fails (ValueError) if a
        # checkout took it after it was looked at.
        while len(stack) > 1:
            try:
                oldest = stack[0]
            except IndexError:
                return
            if now - oldest.idle_since < IDLE_CLOSE_S:
                return
            try:
                stack.remove(oldest)
            except ValueError:
                return
            self._discard(oldest)

    def _script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """One script call: its reply, or its error reply raised; sent again once after NOSCRIPT."""
        [reply] = self._send_scripts([(name, keys, args)])
        if isinstance(reply, redis.exceptions.NoScriptError):
            [reply] = self._send_scripts([(name, keys, args)])
        if isinstance(reply, Exception):
            raise reply
        return reply

    def _acks_held(self, acks: Sequence[tuple[Lease, str | None]], reply: Any, now: float | None) -> list[bool]:
        """ack_many's replies as held or not; any ack it could not settle is acked on its own."""
        if not (isinstance(reply, list) and len(reply) == len(acks)):
            reply = [None] * len(acks)  # an error reply, or none: it may have landed
            for lease, _ in acks:  # until each is answered (see _settle)
                self._unsure[lease.job_id] = lease.token
        held: list[bool] = []
        for (lease, result), r in zip(acks, reply, strict=True):
            if r == "ok" or (r == "lost" and not self._was_unsure(lease)):
                self._unsure.pop(lease.job_id, None)
                self._forget(lease.job_id)
                held.append(r == "ok")
            else:  # 'need:<queue>' (nothing done), unknown, or refused after a lost reply: looked at
                held.append(self._ack_or_landed(lease, result, now))
        return held

    def _ack_or_landed(self, lease: Lease, result: str | None, now: float | None) -> bool:
        try:
            self.ack(lease, result, now=now)
            return True
        except LeaseLost:
            # A pipelined try may have landed before the connection broke.
            last = self._call("check", lambda: self._r.hget(self.keys.job(lease.job_id), "last_token"), safe=True)
            return bool(last == lease.token)

    def retry(self, lease: Lease, error: ErrorInfo, *, delay: float, now: float | None = None) -> JobState:
        d = float(delay)
        if math.isnan(d) or math.isinf(d):
            raise ValueError(f"retry delay must be a finite number of seconds, got {delay!r}")
        res = self._settle_error("retry", lease, [repr(max(d, 0.0))], error, now)
        if res[0] != "ok":
            raise LeaseLost(lease.job_id, "retry refused")
        return JobState(res[1])

    def _settle_error(self, name: str, lease: Lease, args: Sequence[Any], error: ErrorInfo,
                      now: float | None) -> list[Any]:
        """retry or kill with the error as its last argument. One bigger than OOM_SLACK is sent
        by the strict script first; refused at maxmemory (before it ran), it goes again cut to
        fit, so a full Redis still records the outcome, and grows by at most OOM_SLACK."""
        members = _error_members(error)
        if len(members) <= OOM_SLACK:
            return self._settle(name, lease, [*args, members], now)
        try:
            return self._settle(f"{name}:strict", lease, [*args, members], now)
        except StorageFull as exc:
            if "maxmemory" not in str(exc):
                raise  # MISCONF (a disk full): the cut error would be refused too
        return self._settle(name, lease, [*args, _error_members(_cut(error))], now)

    def kill(self, lease: Lease, error: ErrorInfo, *, now: float | None = None) -> None:
        res = self._settle_error("kill", lease, [], error, now)
        if res[0] != "ok":
            raise LeaseLost(lease.job_id, "kill refused")

    def release(self, leases: Sequence[Lease], *, now: float | None = None) -> list[int]:
        if not leases:
            return []
        args: list[Any] = [self._now_arg(now)]
        for lease in leases:
            args += [lease.job_id, lease.token]
        res = self._run("release", self._guess([lease.job_id for lease in leases]), args, safe=True)
        released = [int(i) for i in res[1:]]
        for i in released:
            self._forget(i)
        return released

    # -- maintenance ----------------------------------------------------------------------
    def reap(self, *, limit: int = 1000, now: float | None = None) -> ReapResult:
        if limit <= 0:
            return ReapResult()
        self._sweep_all(now)
        queues = self._due_queues(self.keys.leases, f"({self._due_bound(now)!r}", limit) + self._sweep_slice()
        res = self._run("reap", queues, [self._now_arg(now), limit, MAX_STALLS], safe=True)
        return ReapResult(requeued=sorted(int(i) for i in res[1]), dead=sorted(int(i) for i in res[2]))

    def promote(self, *, limit: int = 1000, now: float | None = None) -> int:
        if limit <= 0:
            return 0
        self._sweep_all(now)
        queues = self._due_queues(self.keys.schedule, repr(self._due_bound(now)), limit)
        res = self._run("promote", queues, [self._now_arg(now), limit], safe=True)
        return int(res[1])

    @staticmethod
    def _due_bound(now: float | None) -> float:
        """The time up to which the client looks for due entries. Without an injected time it
        cannot know Redis's clock, so it looks a little past its own: the script decides by
        Redis's, and asks ('need') for a queue the client missed."""
        return now if now is not None else time.time() + CLOCK_MARGIN_S

    def _due_queues(self, key: str, bound: str, limit: int) -> list[str]:
        """The queues of the entries of P:leases or P:schedule due by ``bound``: the blocks the
        reap or promote script will need, read first so that it needs one call."""
        members = self._call("read due entries", lambda: self._r.zrangebyscore(key, "-inf", bound, start=0, num=limit),
                             safe=True)
        return list(dict.fromkeys(str(m).partition("/")[2] for m in members))

    def maintenance_turn(self, interval: float) -> bool:
        """A key taken with SET NX PX for ``interval``, left to expire: the first worker to ask
        in each interval reaps and promotes, the others skip (their calls would find nothing)."""
        ms = max(1, int(interval * 1000))
        took = self._call("maintenance turn", lambda: self._r.set(self.keys.maintenance, self._id, nx=True, px=ms),
                          safe=False)
        return bool(took)

    def _sweep_all(self, now: float | None) -> None:
        """Once per backend: if the store is not marked indexed (written by a version before
        P:leases and P:schedule), sweep every queue into them (see sweep.lua), then mark it."""
        if self._swept:
            return
        if not self._call("check indexes", lambda: self._r.exists(self.keys.indexed), safe=True):
            queues = self._refresh_queues()
            for start in range(0, len(queues), SWEEP_QUEUES):
                self._run("sweep", queues[start:start + SWEEP_QUEUES], [self._now_arg(now), 1000], safe=True)
            self._call("mark indexed", lambda: self._r.set(self.keys.indexed, "1"), safe=True)
        self._swept = True

    def _sweep_slice(self) -> list[str]:
        """The next few queues of the queue set, going round it: each reap also sweeps them (a
        lease only a queue's own set knows, written by a worker of the previous version still
        running during an upgrade, is found within one round)."""
        queues = self._all_queues()
        if self._sweep_at >= len(queues):
            self._sweep_at = 0
            queues = self._refresh_queues()
        chunk = queues[self._sweep_at:self._sweep_at + SWEEP_PER_REAP]
        self._sweep_at += SWEEP_PER_REAP
        return chunk

    def prune(
        self, *, older_than: float, states: Sequence[JobState] = (JobState.SUCCEEDED,),
        limit: int = 1000, now: float | None = None,
    ) -> int:
        names = []
        for state in states:
            if not JobState(state).is_final:
                raise ValueError(f"prune only deletes finished jobs, not {state}")
            names.append(str(JobState(state)))
        if limit <= 0 or not names:
            return 0
        res = self._run("prune", self._all_queues(), [self._now_arg(now), repr(float(older_than)), limit, *names],
                        safe=True, all_queues=True)
        return int(res[1])

    # -- inspection and administration ----------------------------------------------------
    def get(self, job_id: int) -> Job | None:
        keys = [self.keys.job(job_id), self.keys.errors(job_id)]
        flat, errors = self._call("get", functools.partial(self._script, "get", keys, []), safe=True)
        if not flat:
            return None
        return _to_job(job_id, dict(zip(flat[::2], flat[1::2], strict=True)), errors)

    def list_jobs(
        self, *, state: JobState | None = None, queue: str | None = None, task: str | None = None,
        cursor: int | None = None, limit: int = 50,
    ) -> Page:
        if limit <= 0:
            return Page(jobs=[], next_cursor=None)
        # The queue's block, or every queue's: the script folds their inboxes before it reads.
        args = ["" if cursor is None else int(cursor), limit, max(LIST_BUDGET, limit + 1),
                "" if state is None else str(JobState(state)), queue or "", task or ""]
        queues = self._all_queues() if queue is None else [queue]
        raw, next_cursor = self._run("list_jobs", queues, args, safe=True, all_queues=queue is None)
        return Page(jobs=[self._job(r) for r in raw], next_cursor=int(next_cursor) if next_cursor else None)

    def stats(self, *, now: float | None = None, worker_ttl: float = 60.0, finished: bool = True) -> Stats:
        # Every count here is a ZCARD/SCARD, cheap either way; ``finished=False`` still reports
        # succeeded/cancelled as 0, as the contract says.
        res = self._run("stats", self._all_queues(), [self._now_arg(now), repr(float(worker_ttl))],
                        safe=True, all_queues=True)
        t = float(res[1])
        queues = []
        for name, sched, avail, running, ok, dead, cancelled, due, oldest, expiries, expired in res[2]:
            counts = (int(sched), int(avail), int(running), int(ok) if finished else 0, int(dead),
                      int(cancelled) if finished else 0)
            if not any(counts) and expiries == "":
                continue  # every job of this queue was pruned: as absent as on the SQL stores
            queues.append(QueueStats(
                queue=name, scheduled=counts[0] - int(due), available=counts[1] + int(due), running=counts[2],
                succeeded=counts[3], dead=counts[4], cancelled=counts[5],
                oldest_available_age=max(0.0, t - float(oldest)) if oldest != "" else None,
                lease_expiries=int(expiries or 0), expired_leases=int(expired),
            ))
        workers = []
        for wid, info, last_seen in res[3]:
            d = json.loads(info)
            workers.append(WorkerInfo(
                id=wid, queues=list(d["queues"]), concurrency=int(d["concurrency"]), host=str(d["host"]),
                pid=int(d["pid"]), started_at=float(d["started_at"]), last_seen=float(last_seen),
                running=int(d["running"]), stuck=int(d.get("stuck", 0)),  # (absent: written before 'stuck' was)
            ))
        workers.sort(key=lambda w: (w.started_at, w.id))
        return Stats(now=t, queues=sorted(queues, key=lambda q: q.queue), workers=workers)

    def redrive(self, job_ids: Sequence[int] | None = None, *, queue: str | None = None,
                now: float | None = None) -> int:
        if job_ids is not None:
            total = 0
            ids = [int(i) for i in job_ids]
            for start in range(0, len(ids), BATCH):
                res = self._run("redrive", self._all_queues(), [self._now_arg(now), "ids", *ids[start:start + BATCH]],
                                safe=False, all_queues=True)
                total += int(res[1])
            return total
        total, cursor = 0, "+inf"
        while True:
            res = self._run("redrive", self._all_queues(), [self._now_arg(now), "all", queue or "", cursor, BATCH],
                            safe=False, all_queues=True)
            total += int(res[1])
            cursor = res[2]
            if not cursor:
                return total

    def purge(self, *, state: JobState = JobState.DEAD, queue: str | None = None,
              job_ids: Sequence[int] | None = None) -> int:
        state = JobState(state)
        if not state.is_final:
            raise ValueError(f"purge only deletes finished jobs, not {state}")
        total = 0
        if job_ids is not None:
            ids = [int(i) for i in job_ids]
            for start in range(0, len(ids), BATCH):
                res = self._run("purge", self._all_queues(), [str(state), queue or "", "ids", *ids[start:start + BATCH]],
                                safe=True, all_queues=True)
                total += int(res[1])
            return total
        while True:
            res = self._run("purge", self._all_queues(), [str(state), queue or "", "all", BATCH],
                            safe=True, all_queues=True)
            total += int(res[1])
            if not int(res[2]):
                return total

    def cancel(self, job_id: int, *, now: float | None = None) -> bool:
        res = self._run("cancel", self._guess([job_id]), [self._now_arg(now), int(job_id)], safe=False)
        done = bool(int(res[1]))
        if done:
            self._forget(job_id)
        return done

    # -- waiting ------------------------------------------------------------------------------
    def wait_for_jobs(self, queues: Sequence[str], timeout: float, *, verify: bool = True) -> bool:
        def pop(wake_keys: list[str], pause: float) -> tuple[bool, None] | None:
            # A marker only says "something changed": with verify, look again before reporting
            # work, so a worker whose neighbour took the job goes back to sleep. Popping a marker
            # twice is harmless, hence "safe" (retried while Redis is away).
            block = functools.partial(self._rb.blpop, wake_keys, timeout=pause)
            if self._call("wait for jobs", block, safe=True) is not None and not verify:
                return True, None
            return None

        return self._wait(queues, timeout, pop)[0]

    def wait_and_claim(
        self, queues: Sequence[str], timeout: float, claims: Sequence[tuple[str, int]], *,
        worker_id: str, lease_s: float, start: int | None = None,
    ) -> tuple[bool, list[Job] | None]:
        """The idle wait with the claims sent in the same write as its blocking pop: Redis holds
        them behind the pop and runs them the moment it returns (a wake-up marker, or its
        timeout), so the jobs come back with the wake-up instead of a round trip after it. A
        worker killed while it waits takes the claims with it unrun (Redis drops a closed
        client's pending commands)."""
        claims = [(q, n) for q, n in claims if n > 0]
        if not claims:
            return super().wait_and_claim(queues, timeout, claims, worker_id=worker_id, lease_s=lease_s)
        starts: list[int] = []
        left = sum(n for _, n in claims) if start is None else max(start, 0)
        for _, n in claims:
            starts.append(min(n, left))
            left -= starts[-1]

        def pop(wake_keys: list[str], pause: float) -> tuple[bool, list[Job] | None] | None:
            tokens = [_tokens(n) for _, n in claims]
            try:
                woken, jobs = self._call("wait for jobs", functools.partial(
                    self._pop_then_claim, wake_keys, pause, claims, starts, tokens, worker_id, lease_s), safe=False)
            except StoreUnavailable:
                for (q, _), toks in zip(claims, tokens, strict=True):
                    self._give_back_lost_claim(q, toks[0][:24], None)
                raise
            if jobs is None:  # no claim ran: the caller claims
                return woken, None
            if woken or jobs:
                return True, jobs
            return None  # the pop timed out and the claims found nothing: wait on

        return self._wait(queues, timeout, pop)

    def _wait(self, queues: Sequence[str], timeout: float,
              pop: Callable[[list[str], float], tuple[bool, list[Job] | None] | None]) -> tuple[bool, list[Job] | None]:
        """The idle wait: look (peek), then block in ``pop`` on the wake lists for a slice, until
        ``pop`` has an answer, a job is waiting, ``wake()`` or ``close()`` is called, or the
        timeout runs out (False)."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._wake_lock:
            generation = self._wake_gen
            self._waiters += 1
        wake_keys = [self.keys.queue(q, "wake") for q in queues] + [self._private_wake]
        try:
            while True:
                if self._wake_gen != generation or self._closed:
                    return True, None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False, None
                try:
                    ready, due_in = self._peek(queues)
                    if ready:
                        return True, None
                    pause = min(remaining, WAIT_SLICE)
                    if due_in is not None:
                        pause = min(pause, due_in)
                    answer = pop(wake_keys, max(pause, 0.001))
                except Exception:
                    if self.closed:
                        return True, None  # close() pulled the socket from under us: that is a wake-up
                    raise
                if answer is not None:
                    return answer
        finally:
            with self._wake_lock:
                self._waiters -= 1

    def _pop_then_claim(self, wake_keys: list[str], pause: float, claims: Sequence[tuple[str, int]],
                        starts: Sequence[int], tokens: Sequence[list[str]], worker_id: str,
                        lease_s: float) -> tuple[bool, list[Job] | None]:
        """One BLPOP on the wake keys with the claims pipelined behind it: (woken, the jobs, or
        None if no claim ran: an error reply, such as a script not loaded yet, which
        _send_scripts then loads). ``starts``: each claim's ``start``."""
        calls: list[_ScriptCall] = [
            ("claim", [*self.keys.header, *self.keys.block(q)],
             [1, q, "", n, repr(float(lease_s)), worker_id, CLAIM_SCAN, first, *toks])
            for (q, n), first, toks in zip(claims, starts, tokens, strict=True)
        ]
        popped, *replies = self._send_scripts(calls, first=("BLPOP", *wake_keys, repr(pause)))
        jobs: list[Job] | None = None
        for (q, _), toks, res in zip(claims, tokens, replies, strict=True):
            if isinstance(res, list) and (not res or res[0] not in ("need", "stale")):
                jobs = [*(jobs or []), *self._claimed(res, q, worker_id, toks)]
        return popped is not None, jobs

    def _peek(self, queues: Sequence[str]) -> tuple[bool, float | None]:
        """(jobs are waiting now, seconds until the earliest scheduled job is due)."""
        res = self._run("peek", queues, [""], safe=True)
        if int(res[0]):
            return True, None
        return False, float(res[1]) if res[1] != "" else None

    def wake(self) -> None:
        """Interrupt this process's waiters: a local flag, plus a marker on a key only this
        backend's waiters block on (so another worker's sleep is never disturbed)."""
        with self._wake_lock:
            self._wake_gen += 1
            waiters = self._waiters
        if not waiters or self._closed:
            return

        def push() -> None:
            try:
                pipe = self._r.pipeline(transaction=True)
                pipe.lpush(self._private_wake, *["1"] * waiters)
                pipe.expire(self._private_wake, 60)
                pipe.execute()
            except Exception:  # best effort: the waiters see the flag after their slice anyway
                pass

        # Off the caller's thread: wake() runs on the worker's event loop at shutdown, which
        # must not stall on a Redis that is down.
        threading.Thread(target=push, name="conveyor-redis-wake", daemon=True).start()

    # -- workers --------------------------------------------------------------------------
    def record_worker(self, info: WorkerInfo, *, now: float | None = None) -> None:
        doc = json.dumps({
            "queues": list(info.queues), "concurrency": info.concurrency, "host": info.host, "pid": info.pid,
            "started_at": info.started_at, "running": info.running, "stuck": info.stuck,
        })
        self._run("record_worker", [], [self._now_arg(now), info.id, doc], safe=True)

    def remove_worker(self, worker_id: str) -> None:
        self._run("remove_worker", [], [worker_id], safe=True)

    def startup_warnings(self) -> list[str]:
        """Settings of this Redis that can lose or delete jobs, as sentences for the worker log."""
        warnings: list[str] = []
        info: dict[str, Any] = self._call("read server info", lambda: self._r.info("persistence"), safe=True)
        memory: dict[str, Any] = self._call("read server info", lambda: self._r.info("memory"), safe=True)

        def config(name: str) -> str | None:
            def read() -> str | None:
                try:
                    got = self._r.config_get(name)
                except redis.ResponseError:
                    return None  # managed services often refuse CONFIG; say what we know from INFO
                value = got.get(name) if isinstance(got, dict) else None
                return None if value is None else str(value)

            # A safe read: a broken connection is retried (unguarded, it ended the worker's start).
            return self._call("read the config", read, safe=True)

        if not int(info.get("aof_enabled", 0)):
            save = config("save")
            if save == "":
                warnings.append(
                    f"Redis at {self._where} has no persistence (appendonly no, save \"\"): a restart of Redis "
                    "loses every job, including acknowledged enqueues. Use appendonly yes (see docs/redis.md)."
                )
            else:
                rule = f" (save {save!r})" if save else ""
                warnings.append(
                    f"Redis at {self._where} persists by RDB snapshots only{rule}: a crash of Redis loses the "
                    "jobs enqueued and the results written since the last snapshot. Use appendonly yes "
                    "(see docs/redis.md)."
                )
        elif config("appendfsync") == "no":
            warnings.append(
                f"Redis at {self._where} uses appendfsync no: an OS crash or power loss can lose the last "
                "~30 s of writes. Use appendfsync everysec or always (see docs/redis.md)."
            )
        warnings += _exposure_warnings(self._redis_url, self._where)
        policy = str(memory.get("maxmemory_policy", "noeviction"))
        if policy != "noeviction":
            warnings.append(
                f"Redis at {self._where} has maxmemory-policy {policy}: under memory pressure Redis would "
                "silently delete jobs. Use maxmemory-policy noeviction."
            )
        return warnings


def _plain(job: NewJob) -> bool:
    """A job enqueue_one.lua can write: due now, and none of the options that need the enqueue
    script's checks or extra writes. (Anything else, a bad value included, goes the general way.)"""
    return (
        job.unique_key is None and job.unique_for is None and job.max_depth is None and job.fair_key is None
        and job.concurrency_key is None and job.concurrency_limit is None and job.rate_key is None
        and job.rate_limit is None and job.rate_period is None and job.run_at is None
        and type(job.delay) in (int, float) and job.delay <= 0
    )


def _partly_written(exc: QueueFull | StoreError, written: int, total: int) -> QueueFull | StoreError:
    """``exc`` of the chunk of enqueue_many that starts at job ``written`` (what it says
    applies to that chunk), with what became of the jobs before and after it."""
    last = min(written + ENQUEUE_CHUNK, total) - 1
    text = (f"{exc} (said of jobs {written}-{last} of a batch of {total}, written in chunks of "
            f"{ENQUEUE_CHUNK}); the first {written} jobs of the batch were enqueued before it, "
            "the jobs after it were not")
    if isinstance(exc, QueueFull):
        return QueueFull(text, queue=exc.queue, depth=exc.depth, limit=exc.limit)
    return type(exc)(text)


def _validate(job: NewJob, n: int) -> None:
    """The rules the SQL stores enforce with CHECK constraints, checked before anything is sent,
    because a Lua script that fails half-way does not roll back what it wrote."""

    def bad(why: str) -> StoreError:
        return StoreError(f"job {n} of the batch ({job.task!r}) breaks the store's rules: {why}; nothing was written")

    if isinstance(job.max_attempts, bool) or not isinstance(job.max_attempts, int) or job.max_attempts < 1:
        raise bad(f"max_attempts must be an int >= 1, got {job.max_attempts!r}")
    if not (isinstance(job.timeout, int | float) and math.isfinite(job.timeout) and job.timeout > 0):
        raise bad(f"timeout must be > 0 seconds, got {job.timeout!r}")
    if not isinstance(job.queue, str) or not 1 <= len(job.queue) <= 128:
        raise bad(f"queue name must be 1-128 characters, got {job.queue!r}")
    if not isinstance(job.task, str) or not 1 <= len(job.task) <= 255:
        raise bad(f"task name must be 1-255 characters, got {job.task!r}")
    if isinstance(job.priority, bool) or not isinstance(job.priority, int) or abs(job.priority) > 2**53:
        raise bad(f"priority must be an int, got {job.priority!r}")
    if job.unique_for is not None and (
        isinstance(job.unique_for, bool) or not isinstance(job.unique_for, int | float)
        or not math.isfinite(job.unique_for)
    ):
        raise bad(f"unique_for must be a finite number of seconds, got {job.unique_for!r}")
    if job.fair_key is not None and not isinstance(job.fair_key, str):
        raise bad(f"fair_key must be a str, got {job.fair_key!r}")
    if not (isinstance(job.delay, int | float) and math.isfinite(job.delay)):
        raise bad(f"delay must be a finite number of seconds, got {job.delay!r}")
    if job.run_at is not None and not (isinstance(job.run_at, int | float) and math.isfinite(job.run_at)):
        raise bad(f"run_at must be a finite unix time, got {job.run_at!r}")
    if (job.concurrency_key is None) != (job.concurrency_limit is None):
        raise bad("concurrency_key and concurrency_limit go together")
    if job.concurrency_key is not None and not isinstance(job.concurrency_key, str):
        raise bad(f"concurrency_key must be a str, got {job.concurrency_key!r}")
    if job.concurrency_limit is not None and (
        isinstance(job.concurrency_limit, bool) or not isinstance(job.concurrency_limit, int)
        or not 1 <= job.concurrency_limit <= 2**53
    ):
        raise bad(f"concurrency_limit must be an int >= 1, got {job.concurrency_limit!r}")
    if not (job.rate_key is None) == (job.rate_limit is None) == (job.rate_period is None):
        raise bad("rate_key, rate_limit and rate_period go together")
    if job.rate_key is not None and not isinstance(job.rate_key, str):
        raise bad(f"rate_key must be a str, got {job.rate_key!r}")
    if job.rate_limit is not None and (
        isinstance(job.rate_limit, bool) or not isinstance(job.rate_limit, int) or not 1 <= job.rate_limit <= 2**53
    ):
        raise bad(f"rate_limit must be an int >= 1, got {job.rate_limit!r}")
    if job.rate_period is not None and (
        isinstance(job.rate_period, bool) or not isinstance(job.rate_period, int | float)
        or not math.isfinite(job.rate_period) or job.rate_period <= 0
    ):
        raise bad(f"rate_period must be a finite number of seconds > 0, got {job.rate_period!r}")
    for what, text in (("args", job.args), ("meta", job.meta)):
        if not isinstance(text, str):
            raise bad(f"{what} must be JSON text")


def _error_members(error: ErrorInfo) -> str:
    """The error's own members as JSON text without braces; the script adds attempt, at and worker."""
    return json.dumps(
        {"kind": error.kind, "type": error.type, "message": error.message, "traceback": error.traceback},
        ensure_ascii=False,
    )[1:-1]


def _cut(error: ErrorInfo) -> ErrorInfo:
    """``error`` made to fit OOM_SLACK: the traceback keeps its end (where the exception was
    raised), the message and type their start."""
    note = "[cut: Redis was at maxmemory]\n...\n"
    room = OOM_SLACK // 2
    tb = error.traceback
    if len(tb) > room:
        tb = note + tb[len(tb) - (room - len(note)):]
    quarter = OOM_SLACK // 4
    message = error.message if len(error.message) <= quarter else error.message[:quarter - 3] + "..."
    return dataclasses.replace(error, message=message, type=error.type[:128], traceback=tb)


def _tokens(n: int, claim_id: str | None = None) -> list[str]:
    """``n`` lease tokens for one claim: its claim id (24 hex digits, 96 random bits; a new one
    if None) and the token's place in the claim (8 hex digits). A claimer whose reply was lost
    finds the claim's leases by the id (release_claim)."""
    head = new_claim_id() if claim_id is None else claim_id
    return [f"{head}{i:08x}" for i in range(n)]


def _start_arg(start: int | None, limit: int) -> int:
    """The claim script's ``start``: how many of the jobs start at once (all, if None)."""
    return limit if start is None else max(start, 0)


def _opt_float(value: str | None) -> float | None:
    return None if value is None else float(value)


_NO_LIMITS: Mapping[str, Any] = MappingProxyType({})


def _limits(h: dict[str, str]) -> Mapping[str, Any]:
    """The job's concurrency and rate limit fields, stored only when set (most jobs have none)."""
    if "concurrency_key" not in h and "rate_key" not in h:
        return _NO_LIMITS
    limits: dict[str, Any] = {}
    if "concurrency_key" in h:
        limits.update(concurrency_key=h["concurrency_key"], concurrency_limit=int(h["concurrency_limit"]))
    if "rate_key" in h:
        limits.update(rate_key=h["rate_key"], rate_limit=int(h["rate_limit"]), rate_period=float(h["rate_period"]))
    return limits


def _to_job(job_id: int, h: dict[str, str], errors: Sequence[str]) -> Job:
    raw_meta = h.get("meta", "{}")
    meta = {} if raw_meta == "{}" else json.loads(raw_meta)
    redriven = h.get("redriven")
    if redriven is not None and isinstance(meta, dict):
        # Kept apart from meta so the script never re-encodes the caller's JSON (cjson would
        # round floats to 14 digits); merged here as the SQL stores do with json_set.
        base = meta.get("redriven")
        meta["redriven"] = (base if isinstance(base, int) and not isinstance(base, bool) else 0) + int(redriven)
    return make_job(
        id=job_id, task=h["task"], queue=h["queue"], args=json.loads(h["args"]), state=JobState(h["state"]),
        attempts=int(h["attempt"]), max_attempts=int(h["max_attempts"]), priority=int(h["priority"]),
        run_at=float(h["run_at"]), timeout=float(h["timeout_s"]), created_at=float(h["created_at"]), uid=h.get("uid"),
        attempted_at=_opt_float(h.get("attempted_at")), finished_at=_opt_float(h.get("finished_at")),
        result=json.loads(h["result"]) if "result" in h else None,
        errors=[json.loads(e) for e in errors], unique_key=h.get("unique_key"), worker_id=h.get("worker_id"),
        lease_token=h.get("lease_token"), lease_expires_at=_opt_float(h.get("lease_expires_at")), meta=meta,
        fair_key=h.get("fair_key"), stalls=int(h.get("stalls", 0)), **_limits(h),
        # k[:1] first: most jobs have no step, and a method call per field cost more than the rest.
        steps={k[len(STEP_PREFIX):]: json.loads(v) for k, v in h.items() if k[:1] == "s" and k.startswith(STEP_PREFIX)},
    )


class _KeyLock(StoreLock):
    """A lock key holding this holder's token (see lock.lua and unlock.lua)."""

    def __init__(self, owner: RedisBackend, key: str, token: str, ttl: float) -> None:
        self._owner = owner
        self._key = key
        self._token = token
        self._ttl_ms = max(1, int(ttl * 1000))
        self._held = False

    def take(self, *, first: bool) -> bool:
        self._held = self._owner._lock_call("lock", self._key, [self._token, self._ttl_ms, "1" if first else "0"]) == 1
        return self._held

    def renew(self) -> bool:
        return self._held and self.take(first=False)

    def release(self) -> None:
        with self._owner._locks_mutex:
            self._owner._locks.discard(self)
        if self._held:
            self._held = False
            self._owner._lock_call("unlock", self._key, [self._token])
