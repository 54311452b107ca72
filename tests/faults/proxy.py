"""An in-process TCP proxy the network-fault tests control (reliability plan §7, R14).

``Proxy(target_host, target_port)`` listens on ``127.0.0.1:<free port>`` and forwards every
connection to the target. It runs an asyncio loop on a daemon thread; its controls may be
called from any thread and take effect at once, on open connections too:

* ``pass_through()`` — forward both ways (the default);
* ``latency(ms)`` — deliver each chunk ``ms`` milliseconds after it arrived, in each direction
  (a delay, not a bandwidth limit: chunks in flight overlap);
* ``blackhole()`` — accept connections and forward nothing either way. What arrives is held,
  not lost, and flows when the proxy is healed, as after a partition that TCP outlives;
  clients see a peer that accepts and never answers (like a hung server);
* ``half_open()`` — forward client to server only; the server's replies are dropped for good
  (the server acts on requests whose answers never arrive);
* ``reset()`` — send RST on every open connection now (``SO_LINGER`` 0, then close), both to
  the client and to the server; ``refuse()`` — a mode in which every new connection is reset
  as soon as it is accepted;
* ``heal()`` — back to ``pass_through()``.

Stdlib only; no privileges. ``stats()`` counts connections and bytes, for tests that must show
traffic really went through (so a fault cannot be injected into an unused proxy vacuously).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

MODES = ("pass", "latency", "blackhole", "half_open", "refuse")
CHUNK = 64 * 1024


@dataclass
class ProxyStats:
    accepted: int = 0
    open: int = 0
    reset: int = 0  # connections this proxy reset (reset() or refuse mode)
    to_server: int = 0  # bytes delivered client -> server
    to_client: int = 0  # bytes delivered server -> client
    dropped: int = 0  # bytes thrown away (half-open replies)


@dataclass(eq=False)
class _Pipe:
    """One direction of one connection: chunks waiting, with the time each arrived."""

    writer: asyncio.StreamWriter
    to_server: bool
    queue: deque[tuple[float, bytes | None]] = field(default_factory=deque)  # None: EOF
    wake: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(eq=False)
class _Conn:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    closed: bool = False


class Proxy:
    """A controllable TCP proxy to ``target_host:target_port`` (see the module docstring)."""

    def __init__(self, target_host: str, target_port: int, *, listen_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.listen_host = listen_host
        self.port = 0
        self.mode = "pass"
        self.delay = 0.0  # seconds, in latency mode
        self._stats = ProxyStats()
        self._conns: set[_Conn] = set()
        self._pipes: set[_Pipe] = set()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"proxy->{target_port}", daemon=True)
        self._lock = threading.Lock()

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> Proxy:
        self._thread.start()
        self._server = self._run(asyncio.start_server(self._accept, self.listen_host, 0))
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        self._run(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __enter__(self) -> Proxy:
        return self.start()

    def __exit__(self, *_: Any) -> None:
        self.close()

    def url_for(self, url: str) -> str:
        """``url`` with its host and port replaced by this proxy's (user, password, path and
        query kept)."""
        parts = urlsplit(url)
        auth = parts.netloc.rpartition("@")[0]
        netloc = f"{auth}@" if auth else ""
        return urlunsplit(parts._replace(netloc=f"{netloc}{self.listen_host}:{self.port}"))

    # -- controls (any thread) --------------------------------------------------------------
    def pass_through(self) -> None:
        self._set("pass")

    heal = pass_through

    def latency(self, ms: float) -> None:
        self._set("latency", ms / 1000.0)

    def blackhole(self) -> None:
        self._set("blackhole")

    def half_open(self) -> None:
        self._set("half_open")

    def refuse(self) -> None:
        """Reset every open connection, and every new one as soon as it is accepted."""
        self._set("refuse")
        self.reset()

    def reset(self) -> int:
        """RST every open connection (both sides) now; returns how many."""
        return self._run(self._reset_all())

    def stats(self) -> ProxyStats:
        with self._lock:
            return ProxyStats(**vars(self._stats))

    # -- internals --------------------------------------------------------------------------
    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def _set(self, mode: str, delay: float = 0.0) -> None:
        assert mode in MODES, mode

        def apply() -> None:
            self.mode, self.delay = mode, delay
            for pipe in self._pipes:
                pipe.wake.set()  # re-evaluate held chunks under the new mode

        self._loop.call_soon_threadsafe(apply)
        # Return once the loop has applied it: a test's next call already sees the new mode.
        self._run(asyncio.sleep(0))

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._reset_all()

    async def _reset_all(self) -> int:
        conns = list(self._conns)
        for conn in conns:
            self._abort(conn)
        return len(conns)

    def _abort(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._conns.discard(conn)
        for w in (conn.client, conn.server):
            _rst(w)
        for t in conn.tasks:
            t.cancel()
        with self._lock:
            self._stats.reset += 1
            self._stats.open -= 1

    async def _accept(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        with self._lock:
            self._stats.accepted += 1
        if self.mode == "refuse":
            _rst(cwriter)
            with self._lock:
                self._stats.reset += 1
            return
        try:
            sreader, swriter = await asyncio.open_connection(*self.target)
        except OSError:
            _rst(cwriter)
            return
        conn = _Conn(cwriter, swriter)
        self._conns.add(conn)
        with self._lock:
            self._stats.open += 1
        up, down = _Pipe(swriter, True), _Pipe(cwriter, False)
        self._pipes |= {up, down}
        loop = asyncio.get_running_loop()
        conn.tasks = [
            loop.create_task(self._read(creader, up, conn)), loop.create_task(self._write(up, conn)),
            loop.create_task(self._read(sreader, down, conn)), loop.create_task(self._write(down, conn)),
        ]
        try:
            await asyncio.gather(*conn.tasks, return_exceptions=True)
        finally:
            self._pipes -= {up, down}
            if not conn.closed:
                conn.closed = True
                self._conns.discard(conn)
                with self._lock:
                    self._stats.open -= 1
                for w in (cwriter, swriter):
                    with contextlib.suppress(Exception):
                        w.close()

    async def _read(self, reader: asyncio.StreamReader, pipe: _Pipe, conn: _Conn) -> None:
        while True:
            try:
                data = await reader.read(CHUNK)
            except (ConnectionError, OSError):
                data = b""
            if not pipe.to_server and self.mode == "half_open" and data:
                with self._lock:
                    self._stats.dropped += len(data)
                continue
            pipe.queue.append((time.monotonic(), data or None))
            pipe.wake.set()
            if not data:
                return

    async def _write(self, pipe: _Pipe, conn: _Conn) -> None:
        while True:
            if not pipe.queue or self.mode == "blackhole":
                pipe.wake.clear()
                await pipe.wake.wait()
                continue
            arrived, data = pipe.queue[0]
            if self.mode == "latency":
                due = arrived + self.delay - time.monotonic()
                if due > 0:
                    pipe.wake.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(pipe.wake.wait(), due)
                    continue
            pipe.queue.popleft()
            if data is None:  # the other side closed: pass the close on, after the data
                with contextlib.suppress(Exception):
                    pipe.writer.write_eof()
                # The whole connection ends once both sides are done; a one-sided close
                # (half-close) is rare in these protocols: finish it.
                await asyncio.sleep(0)
                self._finish(conn)
                return
            try:
                pipe.writer.write(data)
                await pipe.writer.drain()
            except (ConnectionError, OSError):
                self._finish(conn)
                return
            with self._lock:
                if pipe.to_server:
                    self._stats.to_server += len(data)
                else:
                    self._stats.to_client += len(data)

    def _finish(self, conn: _Conn) -> None:
        """Close both sides politely (FIN), as the peer did."""
        if conn.closed:
            return
        conn.closed = True
        self._conns.discard(conn)
        with self._lock:
            self._stats.open -= 1
        for w in (conn.client, conn.server):
            with contextlib.suppress(Exception):
                w.close()
        for t in conn.tasks:
            if t is not asyncio.current_task():
                t.cancel()


def _rst(writer: asyncio.StreamWriter) -> None:
    """Close with SO_LINGER (on, 0 s): the kernel sends RST instead of FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
