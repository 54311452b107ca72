"""The connection to Redis: URL options, connections, the retry policy, and script calls.

Every call has a socket timeout. Connection failures become :class:`StoreUnavailable`.
Reads and idempotent writes are retried for a short while; a write that is not idempotent
(enqueue, claim, cancel, ...) is retried only when the failure came before the command was
sent, because a reply lost in flight does not tell whether the script ran.

Script calls go out on connections of our own (made from redis-py's pool class and settings,
counted and closed here), not through redis-py's pipeline: see ``Transport.send_scripts``.

On a cluster URL (``cluster.py``) every connection goes to the node that serves the app's slot,
and follows it when it moves: MOVED is retried there at once, ASK is followed for one command,
TRYAGAIN and CLUSTERDOWN are retried after a pause, all within the call's retry budget (a
redirected command did not run, so even an enqueue is sent again). Not redis-py's RedisCluster:
its retries would send a script again after a reply lost in flight.
"""

from __future__ import annotations

import collections
import functools
import inspect
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.retry import Retry

from ...errors import ConfigurationError, PayloadError, StorageFull, StoreError, StoreUnavailable
from .cluster import (
    SCHEMES,
    ClusterDisabled,
    Route,
    check_cluster_url,
    is_cluster_url,
    node_url,
    seeds_of,
)
from .scripts import BARE_SCRIPTS, GROWING_SCRIPTS, SCRIPT_NAMES, _load_script

try:
    from hiredis import pack_command as _hiredis_pack_command

    def _pack(conn: Any, command: tuple[Any, ...]) -> list[Any]:
        return [_hiredis_pack_command(command)]
except ImportError:  # hiredis comes with the redis extra; redis-py's own packer otherwise
    def _pack(conn: Any, command: tuple[Any, ...]) -> list[Any]:
        return list(conn.pack_command(*command))

T = TypeVar("T")

ScriptCall = tuple[str, Sequence[str], Sequence[Any]]  # script name, keys, args

PREFIX_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
DEFAULT_SOCKET_TIMEOUT = 5.0
DEFAULT_CONNECT_TIMEOUT = 2.0
RETRY_BUDGET = 2.0  # seconds a retryable call keeps trying before it reports the store down
WAIT_SLICE = 1.0  # longest single BLPOP; the socket timeout of waiters is this plus the normal one
# A connection of send_scripts idle this long is closed, all but the most recently used: a burst
# of calls from several threads (a worker waking from a pause, a producer's request spike) made
# one each, and they would otherwise stay open for the process's life. The one kept serves a
# quiet producer without a handshake per call; a burst that comes back pays one per extra thread.
IDLE_CLOSE_S = 2.0


# No CLIENT SETINFO on connect (see Transport.__init__): redis-py 7+ takes driver_info=None;
# before that, lib_name and lib_version None (deprecated since).
_NO_LIB_INFO: dict[str, None] = (
    {"driver_info": None}
    if "driver_info" in inspect.signature(redis.connection.AbstractConnection.__init__).parameters
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
    idle_since = 0.0  # monotonic time it was last handed back to its idle stack (send_scripts)
    route: Route | None = None  # a cluster's: where to connect (see _follow)
    route_gen = -1  # the route's gen when this connection was made

    def __init__(self, *args: Any, route: Route | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.route = route

    def connect(self) -> None:
        route = self.route
        if route is not None:
            self._follow(route)
        try:
            super().connect()  # type: ignore[misc]
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if route is not None:
                route.stale = True  # a failover perhaps: ask the cluster before the next try
            if isinstance(exc, _NotSent | redis.AuthenticationError
                          | redis.exceptions.AuthorizationError):
                raise  # a wrong password is not worth retrying
            raise _NotSent(str(exc)) from exc

    def connect_check_health(self, *args: Any, **kwargs: Any) -> Any:
        # What redis-py's send_packed_command calls to connect again (redis-py 6+).
        if self.route is not None:
            self._follow(self.route)
        return super().connect_check_health(*args, **kwargs)  # type: ignore[misc]

    def _follow(self, route: Route) -> None:
        """Point this connection where the route is: a connection made for an older route is
        closed, and the next connect goes to the route's node."""
        route.refresh()  # (nothing unless a failure made it stale)
        host, port, gen = route.target
        if gen != self.route_gen:
            if getattr(self, "_sock", None) is not None:
                self.disconnect()  # type: ignore[attr-defined]
            self.host, self.port, self.route_gen = host, port, gen


class _Connection(_ConnectMixin, redis.Connection):
    pass


class _SSLConnection(_ConnectMixin, redis.SSLConnection):
    pass


def parse_redis_url(url: str) -> tuple[str, str, dict[str, float]]:
    """Split our own options (``prefix``, the timeouts, ``wait_replicas``) off the URL; the rest
    goes to redis-py (a cluster URL's, node by node: see Transport)."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", *SCHEMES):
        raise ConfigurationError(f"not a redis URL: {_redact(url)!r}")
    if parts.scheme in SCHEMES:
        check_cluster_url(url, _redact(url))
    prefix = "conveyor"
    timeouts = {"socket_timeout": DEFAULT_SOCKET_TIMEOUT,
                "socket_connect_timeout": DEFAULT_CONNECT_TIMEOUT}  # (and wait_replicas)
    rest: list[tuple[str, str]] = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key == "prefix":
            prefix = value
        elif key == "partitions":  # open_backend's (partitions.py): one is a plain app
            if value != "1":
                raise ConfigurationError(f"{_redact(url)!r}: partitions={value} is opened by "
                                         "open_backend (a PartitionedRedis), not a RedisBackend")
        elif key == "wait_replicas":
            if not value.isdigit():
                raise ConfigurationError(
                    f"{_redact(url)!r}: wait_replicas must be a count of replicas (0 or more)")
            timeouts[key] = int(value)
        elif key in timeouts:
            try:
                timeouts[key] = float(value)
            except ValueError:
                raise ConfigurationError(
                    f"{_redact(url)!r}: {key} must be a number of seconds") from None
            if not (timeouts[key] > 0 and math.isfinite(timeouts[key])):
                raise ConfigurationError(f"{_redact(url)!r}: {key} must be > 0 seconds")
        else:
            rest.append((key, value))
    if not PREFIX_RE.fullmatch(prefix):
        raise ConfigurationError(
            f"{_redact(url)!r}: prefix must be 1-64 characters from A-Z a-z 0-9 _ . : -, "
            f"got {prefix!r}"
        )
    return prefix, parts._replace(query=urlencode(rest)).geturl(), timeouts


def _redact(url: str) -> str:
    from .. import redact_url

    return redact_url(url)


def _exposure_warnings(redis_url: str, where: str) -> list[str]:
    """A Redis off this machine reached without TLS or without credentials: anyone on the path
    can read the jobs, and anyone who can connect can change or delete them."""
    parts = urlsplit(redis_url)
    hosts = ([h for h, _ in seeds_of(redis_url)] if parts.scheme in SCHEMES
             else [parts.hostname or "localhost"])
    if parts.scheme == "unix" or all(
            h.lower() in ("localhost", "::1") or h.startswith("127.") for h in hosts):
        return []
    found = []
    if parts.scheme not in ("rediss", "rediss+cluster"):
        found.append(f"Redis at {where} is reached without TLS: job arguments and results cross "
                     "the network in clear. Use rediss:// (see docs/security.md).")
    if not parts.password:
        found.append(f"Redis at {where} is reached without a password: anyone who can connect to "
                     "it can read, change or delete jobs. Use an ACL user with a password "
                     "(redis://user:pass@host).")
    return found


class Transport:
    """One backend's way to Redis: redis-py clients for plain commands (``r``; ``rb`` for the
    idle wait's blocking pops), and connections of its own for script calls."""

    def __init__(self, url: str, redis_url: str, timeouts: dict[str, float], *,
                 slot: int = 0) -> None:
        """``slot``: the app's hash slot, followed on a cluster URL (cluster.py)."""
        self.where = _redact(redis_url)
        self.socket_timeout = timeouts["socket_timeout"]
        self.closed = False  # set by the backend's close()
        # wait_replicas=N: an enqueue waits (WAIT) for N replicas to have it, for up to half the
        # socket timeout (its reply must come within the whole of it).
        self.wait_replicas = int(timeouts.get("wait_replicas", 0))
        self._wait_for_replicas = ("WAIT", self.wait_replicas,
                                   max(1, int(self.socket_timeout * 500)))
        self.route: Route | None = None
        # A cluster's redirections met, by kind (MOVED, ASK, TRYAGAIN, ...): a diagnostic
        # count (increments from several threads may race), which the tests read.
        self.redirects: collections.Counter[str] = collections.Counter()
        if is_cluster_url(redis_url):
            seeds = seeds_of(redis_url)
            self.route = Route(seeds, slot, self._slots_of)
            redis_url = node_url(redis_url, *seeds[0])  # what the pools take their settings from
        tls = urlsplit(redis_url).scheme == "rediss"
        common: dict[str, Any] = {
            "socket_connect_timeout": timeouts["socket_connect_timeout"],
            "socket_keepalive": True,
            "decode_responses": True,
            # Retries are ours (see call): redis-py's would resend a script whose reply was lost.
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
            "route": self.route,
        }
        try:
            self.pool = redis.ConnectionPool.from_url(
                redis_url, socket_timeout=self.socket_timeout, **common)
            # Idle workers block in BLPOP for up to WAIT_SLICE: their reads need a longer timeout.
            self.block_pool = redis.ConnectionPool.from_url(
                redis_url, socket_timeout=WAIT_SLICE + self.socket_timeout, **common
            )
        except ValueError as exc:
            raise ConfigurationError(f"{_redact(url)!r}: {exc}") from None
        self.r = _Client(self, connection_pool=self.pool)
        self.rb = _Client(self, connection_pool=self.block_pool)
        self.scripts: dict[str, Script] = {
            n: self.r.register_script(_load_script(n)) for n in SCRIPT_NAMES}
        self.bare_scripts = {n: self.r.register_script(_load_script(n)) for n in BARE_SCRIPTS}
        # The connections of send_scripts (see there) and of the loop claims: idle ones (those
        # for the idle wait's blocking pop apart, with its longer timeout), and every one made and
        # not yet closed for good, which is both the count checked against max_connections and
        # what close() shuts. They are made from the pools' connection class and settings but
        # not by the pools: a pool counts every connection it makes until the pool is reset, so
        # closing idle ones used its cap up over a process's life.
        self.idle: list[Any] = []
        self.idle_blocking: list[Any] = []
        self.made: set[Any] = set()
        self._made_lock = threading.Lock()
        self._max_connections = int(self.pool.max_connections)

    # -- the retry policy ----------------------------------------------------------------
    def call(self, what: str, fn: Callable[[], T], *, safe: bool) -> T:
        """Run ``fn`` with our retry policy and error translation.

        ``safe``: running it twice does no harm (reads, idempotent writes, fenced writes).
        Otherwise only failures before sending are retried.
        """
        if self.closed:
            raise StoreError("this backend is closed")
        where = self.where
        deadline = time.monotonic() + RETRY_BUDGET
        pause = 0.02
        sent = False  # a try failed after its command may have gone out
        moved = False  # a try was answered MOVED (the next MOVED waits a pause first)
        while True:
            try:
                return fn()
            except (redis.AuthenticationError, redis.exceptions.AuthorizationError) as exc:
                raise StoreError(
                    f"Redis at {where} refused the credentials: {what} failed ({exc}); "
                    "check the user and password in the URL"
                ) from exc
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                unsent = isinstance(exc, _NotSent | redis.BusyLoadingError
                                    | redis.exceptions.MaxConnectionsError)
                sent = sent or not unsent
                if self.route is not None:
                    self.route.stale = True  # a failover perhaps: ask the cluster again
                if (safe or unsent) and not self.closed and time.monotonic() + pause < deadline:
                    time.sleep(pause)
                    pause = min(pause * 2, 0.5)
                    continue
                raise StoreUnavailable(f"Redis at {where} is unreachable: {what} failed "
                                       f"({exc}); {_outcome(sent, safe)}") from exc
            except redis.ResponseError as exc:
                at_once = self._redirected(exc)
                if at_once is None:
                    raise _response_error(exc, what, where) from exc
                # A redirected try did not run: trying again is safe, whatever the call.
                if not self.closed and time.monotonic() + pause < deadline:
                    if at_once and not moved:
                        moved = True
                        continue
                    time.sleep(pause)
                    pause = min(pause * 2, 0.5)
                    continue
                raise StoreUnavailable(
                    f"Redis Cluster at {where} did not serve the app's slot in time: {what} "
                    f"failed ({type(exc).__name__}: {exc}); {_outcome(sent, safe)}") from exc
            except redis.RedisError as exc:
                raise StoreError(f"Redis at {where}: {what} failed: {exc}") from exc
            except UnicodeEncodeError as exc:
                raise PayloadError(f"{what}: a value is not valid UTF-8 text ({exc}); "
                                   "nothing was written") from exc
            except Exception as exc:
                if self.closed:  # close() pulled the socket from under this call
                    # (redis-py then fails oddly)
                    raise StoreError(
                        f"this backend is closed: {what} was cut short ({exc!r})") from exc
                raise

    def _redirected(self, exc: redis.ResponseError) -> bool | None:
        """What a cluster's error reply means for the call that got it: True, go to the node it
        names and try again at once (MOVED); False, try again after a pause (TRYAGAIN while
        the slot moves, CLUSTERDOWN while a failover elects a node, an ASK not followed, a
        replica's READONLY); None, it is not a cluster's redirection (or this is no cluster)."""
        route = self.route
        if route is None:
            return None
        kind = next((k for cls, k in _REDIRECTIONS if isinstance(exc, cls)), None)
        if kind is None:
            return None
        self.redirects[kind] += 1
        if isinstance(exc, redis.exceptions.MovedError):
            route.move(exc.host, exc.port)
            return True
        if kind in ("CLUSTERDOWN", "READONLY"):
            route.stale = True  # the node may be down or demoted: ask the cluster again
        return False

    # -- script calls --------------------------------------------------------------------
    def script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """One script call: its reply, or its error reply raised; sent again once after
        NOSCRIPT, and to the node an ASK names (see asked). An enqueue with wait_replicas
        is followed by WAIT on the same connection (see _replicated)."""
        last = self._wait_for_replicas if self.wait_replicas and name in GROWING_SCRIPTS else None
        reply, *waited = self.send_scripts([(name, keys, args)], last=last)
        if isinstance(reply, redis.exceptions.NoScriptError):
            reply, *waited = self.send_scripts([(name, keys, args)], last=last)
        if waited and not isinstance(reply, Exception):
            self._replicated(name, waited[0])
        if self._follows_ask(reply):  # (an enqueue is never run by ASK: see cluster.py)
            command = ("EVALSHA", self.scripts[name].sha, len(keys), *keys, *args)
            try:
                reply = self.asked(reply, self.pool, command, lambda conn: conn.read_response())
            except redis.ResponseError as exc:
                reply = exc
        if isinstance(reply, Exception):
            raise reply
        return reply

    def _replicated(self, name: str, confirmed: Any) -> None:
        """The WAIT after an enqueue: fewer replicas than wait_replicas have it. The job is on
        the primary, and runs unless a failover comes before the replicas catch up: told to
        the caller as a reply lost (it may or may not run), never retried (it would be written
        twice)."""
        if isinstance(confirmed, int) and confirmed >= self.wait_replicas:
            return
        seconds = self._wait_for_replicas[2] / 1000
        raise StoreUnavailable(
            f"Redis at {self.where}: {name.partition(':')[0]} was written on the primary, but "
            f"{confirmed} of {self.wait_replicas} replicas confirmed it within {seconds:g} s "
            "(wait_replicas): a failover before they catch up would lose it, so it may or may "
            "not happen")

    def _follows_ask(self, reply: Any) -> bool:
        return (self.route is not None and isinstance(reply, redis.exceptions.AskError)
                and not isinstance(reply, redis.exceptions.MovedError))

    def asked(self, ask: redis.exceptions.AskError, pool: redis.ConnectionPool,
              command: tuple[Any, ...], read: Callable[[Any], T]) -> T:
        """Follow an ASK for one command: on a connection of its own to the node named (the
        slot is moving there), ASKING, then ``command``, whose reply ``read`` reads. A script
        that node does not have yet is loaded there first (by its SHA's text)."""
        assert self.route is not None
        self.redirects["ASK followed"] += 1
        host = ask.host or self.route.address[0]
        conn = pool.connection_class(**{**pool.connection_kwargs, "route": None,
                                        "host": host, "port": ask.port})

        def send() -> T:
            conn.send_command("ASKING")  # (the next command only)
            conn.read_response()
            conn.send_command(*command)
            return read(conn)

        try:
            conn.connect()
            try:
                return send()
            except redis.exceptions.NoScriptError:
                text = self._script_text(str(command[1])) if command[0] == "EVALSHA" else None
                if text is None:
                    raise
            conn.send_command("SCRIPT", "LOAD", text)
            conn.read_response()
            return send()
        finally:
            conn.disconnect()

    def _script_text(self, sha: str) -> str | None:
        for script in [*self.scripts.values(), *self.bare_scripts.values()]:
            if script.sha == sha:
                return str(script.script)
        return None

    def _slots_of(self, host: str, port: int) -> Any:
        """CLUSTER SLOTS of one node, on a connection of its own (Route.refresh)."""
        pool = self.pool
        conn = pool.connection_class(**{**pool.connection_kwargs, "route": None,
                                        "host": host, "port": port})
        try:
            conn.connect()
            conn.send_command("CLUSTER", "SLOTS")
            try:
                return conn.read_response()
            except redis.ResponseError as exc:
                if "cluster support disabled" in str(exc):
                    raise ClusterDisabled(
                        f"{host}:{port} is not a Redis Cluster node ({exc}): a "
                        "redis+cluster:// URL names cluster nodes; use redis:// for a "
                        "standalone server") from exc
                raise
        finally:
            conn.disconnect()

    def send_scripts(self, calls: Sequence[ScriptCall], *,
                     first: tuple[Any, ...] | None = None,
                     last: tuple[Any, ...] | None = None) -> list[Any]:
        """EVALSHA each (script, keys, args) in one write on one connection of ours; the replies
        in order, an error reply as its exception. This is redis-py's pipeline without its
        command layer (argument checks, observability hooks, Script objects that ask SCRIPT
        EXISTS first), which cost more client time than the script took to run. Commands go
        out through the connection's send_packed_command and replies come back through its
        parser, so timeouts, reconnects and error classes are redis-py's own. On NOSCRIPT (a
        new server, a restart, a SCRIPT FLUSH) the refused scripts are loaded again; the refused
        calls did nothing, and their callers send them again or take the careful path.
        The connection comes from a list of our own rather than redis-py's pool, whose checkout
        (a lock, pid and connection-count bookkeeping, observability hooks) cost a noticeable
        part of a one-job enqueue; the one check of it that matters is kept: a connection the
        server closed is replaced before anything is sent on it.
        ``first``: a plain command sent ahead of the scripts in the same write (the idle wait's
        blocking pop, on a connection with the longer timeout); its reply comes first. ``last``:
        one sent after them (an enqueue's WAIT); its reply comes last."""
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
                command = ("EVALSHA", self.scripts[name].sha, len(keys), *keys, *args)
                packed += _pack(conn, command)
            if last is not None:
                packed += _pack(conn, last)
            conn.send_packed_command(packed, check_health=False)
            replies: list[Any] = []
            if first is not None:
                try:
                    head = conn.read_response()
                except redis.ResponseError as exc:  # (a cluster's redirection: see callers)
                    head = exc
            refused = False
            for _ in calls:
                try:
                    replies.append(conn.read_response())
                except redis.ResponseError as exc:
                    replies.append(exc)
                    refused = True
            if last is not None:
                try:
                    tail = conn.read_response()
                except redis.ResponseError as exc:
                    tail = exc
        except BaseException as exc:
            conn.disconnect()  # replies may be left unread on it
            if self.route is not None and isinstance(exc, redis.ConnectionError
                                                     | redis.TimeoutError | OSError):
                self.route.stale = True
            raise
        finally:
            self._checkin(self.idle if first is None else self.idle_blocking, conn)
        if refused:
            self.reload_refused(calls, replies)
        if last is not None:
            replies.append(tail)
        return replies if first is None else [head, *replies]

    def reload_refused(self, calls: Sequence[ScriptCall], replies: Sequence[Any]) -> None:
        """Load again the scripts the server answered NOSCRIPT to (blocking)."""
        for name in {name for (name, _, _), r in zip(calls, replies, strict=True)
                     if isinstance(r, redis.exceptions.NoScriptError)}:
            script = self.scripts[name]
            script.sha = self.call("load scripts",
                                   functools.partial(self.r.script_load, script.script), safe=True)

    # -- connections ---------------------------------------------------------------------
    def _checkout(self, *, blocking: bool = False) -> Any:
        try:
            return (self.idle_blocking if blocking else self.idle).pop()  # atomic: no lock needed
        except IndexError:
            return self.make_connection(blocking=blocking)

    def make_connection(self, *, blocking: bool = False) -> Any:
        """A new connection (not connected yet), counted in ``made`` until ``discard``."""
        pool = self.block_pool if blocking else self.pool
        with self._made_lock:
            if len(self.made) >= self._max_connections:
                raise redis.exceptions.MaxConnectionsError(
                    f"Too many connections: {len(self.made)} open, "
                    f"max_connections={self._max_connections}")
            conn = pool.connection_class(**pool.connection_kwargs)
            self.made.add(conn)
        return conn

    def points_elsewhere(self, conn: Any) -> bool:
        """Whether ``conn`` was made for an older route of a cluster (the slot moved since)."""
        return self.route is not None and conn.route_gen != self.route.target[2]

    def discard(self, conn: Any) -> None:
        """Close ``conn`` for good and give its place under max_connections back."""
        with self._made_lock:
            self.made.discard(conn)
        conn.disconnect()

    def _checkin(self, stack: list[Any], conn: Any) -> None:
        """Hand ``conn`` back (to the top: the next checkout takes the most recently used),
        then close what has been idle for IDLE_CLOSE_S in either stack (see there)."""
        now = time.monotonic()
        conn.idle_since = now
        stack.append(conn)
        self._close_idle(self.idle, now)
        self._close_idle(self.idle_blocking, now)

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
            self.discard(oldest)

    def open_connections(self) -> int:
        """How many connections to Redis are open now (of ours and of both pools)."""
        pooled = []
        for pool in (self.pool, self.block_pool):
            with pool._lock:
                pooled += [*pool._available_connections, *pool._in_use_connections]
        return sum(1 for c in [*list(self.made), *pooled] if getattr(c, "_sock", None) is not None)

    def disconnect_all(self) -> None:
        # Disconnecting shuts the waiters' sockets down, which ends their BLPOP at once.
        self.pool.disconnect()
        self.block_pool.disconnect()
        for conn in list(self.made):
            conn.disconnect()

    def after_fork_in_child(self) -> None:
        """In a forked child: forget the parent's connections (never close or talk on them:
        they are the parent's sockets too); the child makes its own. The lock is made anew: a
        parent thread may have held it at the fork."""
        self.idle, self.idle_blocking, self.made = [], [], set()
        self._made_lock = threading.Lock()
        if self.route is not None:
            self.route.after_fork_in_child()
        self.pool.reset()
        self.block_pool.reset()


def _outcome(sent: bool, safe: bool) -> str:
    """What a call that gave up tells its caller about whether it happened."""
    if not sent:
        return "nothing was done"
    if safe:
        # (The last try may have failed to connect: an earlier one was sent.)
        return "a reply was lost, so it may or may not have happened; it is safe to try again"
    return "the reply was lost, so it may or may not have happened"


# The error replies of a cluster that mean "not here, or not now" (the command did not run),
# most specific first.
_REDIRECTIONS: tuple[tuple[type[Exception], str], ...] = (
    (redis.exceptions.MovedError, "MOVED"),
    (redis.exceptions.AskError, "ASK"),
    (redis.exceptions.TryAgainError, "TRYAGAIN"),
    (redis.exceptions.ClusterDownError, "CLUSTERDOWN"),
    (redis.ReadOnlyError, "READONLY"),
)


class _Client(redis.Redis):
    """redis-py's client for plain commands, which follows a cluster's ASK for the one command
    that got it (Transport.asked). MOVED and the rest are Transport.call's."""

    def __init__(self, transport: Transport, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._transport = transport

    def execute_command(self, *args: Any, **options: Any) -> Any:
        try:
            return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        except redis.exceptions.AskError as exc:
            t = self._transport
            if not t._follows_ask(exc):
                raise
            return t.asked(exc, self.connection_pool, args,
                           lambda conn: self.parse_response(  # type: ignore[no-untyped-call]
                               conn, args[0], **options))


def _response_error(exc: redis.ResponseError, what: str, where: str) -> StoreError:
    """An error reply as the error Conveyor raises for it."""
    text = str(exc)
    if (isinstance(exc, redis.exceptions.OutOfMemoryError) or text.startswith("OOM")
            or "maxmemory" in text):
        return StorageFull(
            f"Redis at {where} is out of memory (maxmemory): {what} refused, nothing was written"
        )
    if text.startswith("MISCONF"):
        # Redis refuses writes while it cannot write its AOF or RDB file (a full
        # disk, most often), before running the script: nothing was written.
        return StorageFull(
            f"Redis at {where} cannot persist ({text}): {what} refused, nothing was "
            "written; free disk space where Redis keeps its files, and it resumes by itself"
        )
    if isinstance(exc, redis.ReadOnlyError):
        text += " (this server is a read-only replica: point the URL at the primary)"
    elif isinstance(exc, redis.exceptions.AskError):  # MOVED or ASK on a redis:// URL
        text += (" (this server is a Redis Cluster node: use a redis+cluster:// URL, which "
                 "follows the app's slot)")
    elif isinstance(exc, redis.exceptions.NoPermissionError):
        text += (" (the ACL user needs the scripting, hash, list, set, sorted set and string "
                 "commands)")
    return StoreError(f"Redis at {where}: {what} failed: {text}")

