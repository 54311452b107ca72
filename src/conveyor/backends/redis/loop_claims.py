"""Redis claims made from the worker's event loop (``Backend.loop_claims``).

A busy worker's cycle is: its acks and its next claim go out in one round trip, the claimed
jobs start, they finish, and again. Made on a store thread, each claim cost two hand-offs
between threads (loop to thread, thread back to loop, each a wake-up and a turn at the GIL),
a large part of a cycle of no-op jobs (docs/benchmarks.md, "Design measurements"). Here the
loop writes the two scripts to a socket of its own and is woken by the reply, as it is woken
by anything else.

Only that plain round trip runs on the loop. Everything else is left to RedisBackend's
blocking code, handed back as a function for a store thread: connecting (the handshake, AUTH,
SELECT), a connection found broken before sending, one that breaks after (the acks are then
checked one by one), NOSCRIPT, a claim answered 'need' or 'stale', an ack not settled, an
error reply. So the careful paths stay in one place, and this module is only a transport.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import ssl
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import redis

from ..base import ClaimReply, Lease
from .backend import RedisBackend
from .codec import NO_JOBS, _tokens
from .transport import ScriptCall

try:
    import hiredis
except ImportError:  # the redis extra brings it; without it, claims stay on a store thread
    hiredis = None  # type: ignore[assignment]

log = logging.getLogger("conveyor.backends.redis")

_Acks = Sequence[tuple[Lease, str | None]]
_MAX_HEADS = 64  # packed command heads kept (one per script and queue in use)


def _reply_error(text: str) -> redis.ResponseError:
    # NOSCRIPT is the one error reply told apart here (its scripts are loaded again); every
    # other goes down the careful path, which meets it again and reports it as the sync calls do.
    if text.startswith("NOSCRIPT"):
        return redis.exceptions.NoScriptError(text)
    return redis.ResponseError(text)


class RedisLoopClaims:
    """See the module's text. One per worker; used by its claim loop only, one call at a time."""

    def __init__(self, backend: RedisBackend) -> None:
        self._b = backend
        # One connection object for the worker's life, connected again after a drop (a new one
        # each time would only churn the backend's count of connections).
        self._own: Any = None
        self._sock: socket.socket | None = None
        self._reader: Any = None
        self._closed = False
        # (sha, *keys) -> the packed command's head after its '*<count>' line, and that count
        self._heads: dict[tuple[str, ...], tuple[bytes, int]] = {}

    @classmethod
    def make(cls, backend: RedisBackend) -> RedisLoopClaims | None:
        """None where the claims stay on a store thread: without hiredis (or one older than
        2.2.1, which has no pack_command), and over TLS, whose records do not map onto the
        loop's plain socket reads."""
        if hiredis is None or not hasattr(hiredis, "pack_command"):
            return None
        if issubclass(backend._transport.pool.connection_class, redis.SSLConnection):
            return None
        return cls(backend)

    async def ack_and_claim(
        self, acks: _Acks, queue: str, limit: int, *, worker_id: str, lease_s: float,
        wanted: Callable[[], bool] | None = None, on_reply: Callable[[int], None] | None = None,
        start: int | None = None,
    ) -> ClaimReply | Callable[[], ClaimReply]:
        b = self._b
        if limit <= 0 or b.closed or not self._usable():
            return functools.partial(self._connect_after, acks, queue, limit, worker_id, lease_s,
                                     wanted, start)
        a = self._claim_call(acks, queue, limit, worker_id, lease_s, start)
        return await self._finish(a, on_reply, self._pack(a.calls))

    def claim_ahead(
        self, acks: _Acks, queue: str, limit: int, *, worker_id: str, lease_s: float,
    ) -> _Ahead | None:
        """Send a claim now and return at once; ``finish`` reads its reply. None (nothing
        sent) where the plain path cannot be taken, or the socket takes only part of it."""
        b = self._b
        if limit <= 0 or b.closed or not self._usable():
            return None
        a = self._claim_call(acks, queue, limit, worker_id, lease_s, 0)
        packed = self._pack(a.calls)
        assert self._sock is not None
        try:
            sent = self._sock.send(packed)
        except BlockingIOError:
            return None  # nothing sent
        except OSError:
            self._drop()
            return None
        if sent != len(packed):
            self._drop()  # part of a command went out: the connection is of no further use
            return None
        return a

    async def finish(self, ahead: _Ahead, on_reply: Callable[[int], None] | None = None,
                     ) -> ClaimReply | Callable[[], ClaimReply]:
        """The reply of a claim sent by ``claim_ahead``, as ``ack_and_claim`` gives it."""
        return await self._finish(ahead, on_reply, None)

    def _claim_call(self, acks: _Acks, queue: str, limit: int, worker_id: str,
                    lease_s: float, start: int | None) -> _Ahead:
        tokens = _tokens(limit)
        calls = self._b._claim_calls(acks, queue, limit, worker_id, lease_s, None, tokens, start)
        return _Ahead(acks, queue, limit, worker_id, lease_s, tokens, calls, start)

    async def _finish(self, a: _Ahead, on_reply: Callable[[int], None] | None,
                      packed: bytes | None) -> ClaimReply | Callable[[], ClaimReply]:
        """Send ``packed`` (None: sent already, by claim_ahead), read the replies, and read
        them into what ack_and_claim returns."""
        b = self._b
        sock = self._sock
        assert sock is not None
        try:
            async with asyncio.timeout(b.socket_timeout):
                if packed is not None:
                    await asyncio.get_running_loop().sock_sendall(sock, packed)
                replies = await self._read(len(a.calls))
        except asyncio.CancelledError:
            self._drop()  # sent in part perhaps, or its replies would be read as the next call's
            raise
        except (OSError, TimeoutError, redis.RedisError) as exc:
            self._drop()
            route = b._transport.route
            if route is not None:
                route.stale = True  # a failover perhaps: ask the cluster before reconnecting
            return functools.partial(b._claims_lost, a.acks, _as_redis_error(exc), None, a.queue,
                                     a.tokens)
        if on_reply is not None:
            # The socket is free again: the caller may send its next claim now, for Redis to run
            # while this reply is read into jobs here. It is told how many jobs the reply holds
            # ([time, expiry, job, ...]; 0 for an answer other than jobs).
            res = replies[-1]
            jobs = isinstance(res, list) and res and res[0] not in ("need", "stale", *NO_JOBS)
            on_reply(len(res) - 2 if jobs else 0)
        if b._claims_plain(a.acks, replies):
            return b._claims_done(a.acks, a.queue, a.limit, a.worker_id, a.lease_s, None,
                                  a.tokens, replies, a.start)

        def careful() -> ClaimReply:
            b._transport.reload_refused(a.calls, replies)
            return b._claims_done(a.acks, a.queue, a.limit, a.worker_id, a.lease_s, None,
                                  a.tokens, replies, a.start)

        return careful

    def close(self) -> None:
        self._closed = True
        self._drop()
        if self._own is not None:
            self._b._transport.discard(self._own)

    # -- the socket ---------------------------------------------------------------------------
    def _usable(self) -> bool:
        """Connected, and nothing waiting on the socket: no stray reply, and not closed by the
        server (a restart, CLIENT KILL), which a send would not notice until too late to know
        whether the scripts ran."""
        sock = self._sock
        if sock is None:
            return False
        if self._b._transport.points_elsewhere(self._own):  # the cluster moved the app's slot
            self._drop()
            return False
        if self._reader.has_data():  # a reply no call asked for
            self._drop()
            return False
        try:
            sock.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return True
        except OSError:
            pass
        self._drop()
        return False

    def _connect_after(self, acks: _Acks, queue: str, limit: int, worker_id: str,
                       lease_s: float, wanted: Callable[[], bool] | None,
                       start: int | None) -> ClaimReply:
        """On a store thread: the call the blocking way, then a connection for the next one
        (made after, so a store that is down costs the call no connect timeout of ours).
        ``wanted`` is asked again here, after the hop: a worker that began to stop meanwhile
        writes its acks and claims nothing, rather than claim jobs only to give them back."""
        b = self._b
        if wanted is not None and not wanted():
            limit = 0
        if acks:
            out = b.ack_and_claim(acks, queue, limit, worker_id=worker_id, lease_s=lease_s,
                                  start=start)
        else:
            out = [], b.claim(queue, limit, worker_id=worker_id, lease_s=lease_s, start=start)
        try:
            self._connect()
        except Exception as exc:  # the next call takes this path again
            log.debug("no connection for claims from the event loop yet: %s", exc)
        return out

    def _connect(self) -> None:
        self._drop()
        if self._closed or self._b.closed:
            return
        if self._own is None:
            self._own = self._b._transport.make_connection()  # closed with the backend too
        conn: Any = self._own
        conn.connect()  # redis-py's handshake (HELLO, AUTH, SELECT, CLIENT SETNAME)
        # The scripts this connection sends, loaded first: a NOSCRIPT ack_many ahead of a claim
        # that runs would leave the acked jobs leased beside the new ones (more than the worker
        # may hold) until the careful path acks them. A restarted Redis, which has none, also
        # drops the connection, so each new one loads them.
        for name in ("ack_many", "claim"):
            script = self._b._transport.scripts[name]
            conn.send_command("SCRIPT", "LOAD", script.script)
            script.sha = conn.read_response()
        sock = getattr(conn, "_sock", None)
        if not isinstance(sock, socket.socket) or isinstance(sock, ssl.SSLSocket):
            # make() refuses TLS pools; this catches any other class that wraps its socket.
            self._closed = True
            conn.disconnect()
            return
        sock.setblocking(False)
        self._sock = sock
        self._reader = hiredis.Reader(encoding="utf-8", replyError=_reply_error,
                                      protocolError=redis.exceptions.InvalidResponse)

    def _drop(self) -> None:
        connected = self._sock is not None
        self._sock, self._reader = None, None
        if connected:
            self._own.disconnect()

    def _pack(self, calls: Sequence[ScriptCall]) -> bytes:
        """The calls as the bytes of their EVALSHA commands. A call's head (EVALSHA, the sha,
        its keys: the store's header and its queue's block, the same from one claim to the
        next) is packed once and kept; only its arguments are packed per call (hiredis packs
        a command at about the same cost per argument, and the keys are most of them)."""
        scripts = self._b._transport.scripts
        heads = self._heads
        out = []
        for name, keys, args in calls:
            sha = scripts[name].sha
            head_key = (sha, *keys)
            head = heads.get(head_key)
            if head is None:
                if len(heads) >= _MAX_HEADS:
                    heads.clear()
                command: tuple[Any, ...] = ("EVALSHA", sha, len(keys), *keys)
                packed = hiredis.pack_command(command)
                head = heads[head_key] = (packed[packed.index(b"\r\n") + 2:], 3 + len(keys))
            body, count = head
            tail = hiredis.pack_command(tuple(args))
            out.append(b"*%d\r\n%b%b" % (count + len(args), body,
                                           tail[tail.index(b"\r\n") + 2:]))
        return b"".join(out)

    async def _read(self, n: int) -> list[Any]:
        """The next ``n`` replies on the socket (an error reply comes as its exception, not
        raised)."""
        sock, reader = self._sock, self._reader
        assert sock is not None and reader is not None
        loop = asyncio.get_running_loop()
        replies: list[Any] = []
        while len(replies) < n:
            reply = reader.gets()
            if reply is not False:
                replies.append(reply)
                continue
            data = await loop.sock_recv(sock, 65536)
            if not data:
                raise redis.ConnectionError("Redis closed the connection")
            reader.feed(data)
        return replies


class _Ahead(NamedTuple):
    """A claim sent and not yet read: what reading its replies needs."""

    acks: _Acks
    queue: str
    limit: int
    worker_id: str
    lease_s: float
    tokens: list[str]
    calls: list[ScriptCall]
    start: int | None  # the claim's start (see Backend.claim)


def _as_redis_error(exc: BaseException) -> Exception:
    if isinstance(exc, redis.RedisError):
        return exc
    if isinstance(exc, TimeoutError):
        return redis.TimeoutError(f"no reply within the socket timeout ({exc!r})")
    return redis.ConnectionError(str(exc) or repr(exc))
