"""Idle waits of a partitioned app, grouped per node: sharded pub/sub.

A worker whose queues are in several partitions (partitions.py) must wake when any of them
gets a job. A wake list cannot serve them all at once: one BLPOP's keys must share a slot, so
waiting that way takes a thread and a blocking connection per partition (a worker on a
64-partition app: 64 connections held open while it idles). So each wake-up (``wake`` in
_core.lua) is also published on the shard channel named as the queue's wake list (SPUBLISH:
the node that serves the slot delivers it to its own subscribers), and this module keeps one
connection per node, subscribed (SSUBSCRIBE, a command per partition, since one command's
channels must share a slot) to the wake channels of the queues waited on there, and a thread
that reads it and sets the waiters' events.

Pub/sub keeps nothing, so a waiter looks (look.lua) only once its channels are confirmed
subscribed: a job enqueued after that look is published to it. Whatever can lose a message
makes the waits it could concern subscribe and look again (``Waiter.lose``): a connection
that fails (the reader sees it), a channel the node drops (its slot moved to another node; the
next subscription goes where the partition's route points then), a subscription answered
MOVED. A partition whose channels are not confirmed in CONFIRM_S is left out: the caller
waits on it the old way, on its wake list. So is every partition for REFUSED_PAUSE after a
subscription is refused (an ACL user without channel rights; its scripts' publishing is a
pcall, so it fails quietly too).

Subscriptions stay after a wait ends (an idle worker waits on the same queues again), one per
queue waited on, for the life of the backend.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import redis
from redis.client import PubSub

from .. import forking

if TYPE_CHECKING:
    from .backend import RedisBackend

log = logging.getLogger("conveyor.backends.redis")

CONFIRM_S = 1.0  # how long a wait waits for its subscriptions before it leaves them out
READ_SLICE = 1.0  # a reader's longest read, so it sees close() within it
REFUSED_PAUSE = 60.0  # after a refused subscription, waits use the wake lists this long
PING_EVERY = 5.0  # a subscriber quiet this long asks the node whether it is still there


def node_key(part: RedisBackend) -> Any:
    """Which node serves ``part`` now, as far as its route knows: (host, port) on a cluster,
    "server" on one server (where every partition is)."""
    route = part._transport.route
    return "server" if route is None else route.address


class Waiter:
    """One idle wait: the event its thread sleeps on, the partitions whose channels had a
    message since it last took them (``take_fired``), ``ended``: stop waiting (a wake(),
    close()), and ``lost``: a subscription it relied on is gone, so it must subscribe and look
    again."""

    def __init__(self, *, verify: bool = True) -> None:
        self.event = threading.Event()
        self.verify = verify
        self.ended = False
        self.lost = False
        self._fired: set[int] = set()
        self._lock = threading.Lock()

    def fire(self, partition: int) -> None:
        with self._lock:
            self._fired.add(partition)
        self.event.set()

    def end(self) -> None:
        self.ended = True
        self.event.set()

    def lose(self) -> None:
        self.lost = True
        self.event.set()

    def take_fired(self) -> set[int]:
        with self._lock:
            fired, self._fired = self._fired, set()
        return fired


class _Node:
    """One node's subscriber: a connection subscribed to wake channels served there, and the
    thread that reads it. Broken for good once its connection fails (the hub makes another)."""

    def __init__(self, hub: WakeHub, key: Any, pool: redis.ConnectionPool,
                 silence_s: float) -> None:
        self.hub = hub
        self.key = key
        self.silence_s = silence_s  # how long a PING may go unanswered (the socket timeout)
        self.pubsub = PubSub(connection_pool=pool)
        self.sent: set[str] = set()  # channels an SSUBSCRIBE went out for
        self.confirmed: set[str] = set()
        self.broken = False
        self.thread: threading.Thread | None = None

    def subscribe(self, channels: Sequence[str]) -> None:
        """Send one SSUBSCRIBE (the channels share a slot); the reader sees it confirmed."""
        self.sent.update(channels)
        self.pubsub.ssubscribe(*channels)
        if self.thread is None:
            self.thread = threading.Thread(target=self._read, daemon=True,
                                           name="conveyor-redis-wakes")
            self.thread.start()

    def _read(self) -> None:
        hub = self.hub
        heard = time.monotonic()
        pinged: float | None = None
        try:
            while not self.broken:
                try:
                    message = self.pubsub.get_message(timeout=READ_SLICE)
                except redis.exceptions.MovedError as exc:
                    hub._moved(self, exc)
                    continue
                now = time.monotonic()
                if message is not None:
                    heard, pinged = now, None
                    hub._on_message(self, message)
                elif pinged is None and now - heard >= PING_EVERY:
                    # A quiet connection may be a dead one (a peer gone without a reset, a
                    # half-open path): its messages would be lost without a sign. A PING tells.
                    self.pubsub.ping()
                    pinged = now
                elif pinged is not None and now - pinged > self.silence_s:
                    raise redis.ConnectionError(
                        f"no answer to a PING in {self.silence_s:g}s: taken for dead")
        except redis.ResponseError as exc:  # a subscription refused: ACL, an old server
            hub._refused(exc)
        except Exception as exc:  # the connection failed
            if not self.broken and not hub.closed:
                log.debug("the wake-up subscriber of %s stopped: %r", self.key, exc)
        finally:
            hub._lost(self)
            with contextlib.suppress(Exception):
                self.pubsub.close()


class WakeHub:
    """The wake-up subscriptions of one partitioned app's backends (``parts``), per node."""

    def __init__(self, parts: Sequence[RedisBackend]) -> None:
        self._parts = parts
        self._cond = threading.Condition()
        self._nodes: dict[Any, _Node] = {}
        self._waiters: dict[str, set[Waiter]] = {}  # channel -> the waits watching it
        self._partition: dict[str, int] = {}  # channel -> its partition
        self._refused_until = -math.inf  # see _refused
        self.closed = False
        forking.register(self)

    # -- waiting ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def watch(self, groups: dict[int, list[str]], waiter: Waiter) -> Iterator[set[int]]:
        """Have ``waiter`` fired by the wake-ups of ``groups`` (partition -> its queues) while
        the block runs; yields the partitions whose channels are all confirmed subscribed
        (the others are not watched: the caller waits on them otherwise)."""
        wanted = {p: [self._parts[p].keys.queue(q, "wake") for q in qs]
                  for p, qs in groups.items()}
        with self._cond:
            for p, channels in wanted.items():
                for ch in channels:
                    self._waiters.setdefault(ch, set()).add(waiter)
                    self._partition[ch] = p
        try:
            yield self._subscribe(wanted)
        finally:
            with self._cond:
                for channels in wanted.values():
                    for ch in channels:
                        watching = self._waiters.get(ch)
                        if watching is not None:
                            watching.discard(waiter)
                            if not watching:
                                del self._waiters[ch]

    def _subscribe(self, wanted: dict[int, list[str]]) -> set[int]:
        nodes: dict[int, _Node] = {}
        for p, channels in wanted.items():
            node = self._node(p)
            if node is None:
                continue
            missing = [ch for ch in channels if ch not in node.sent]
            try:
                if missing:
                    node.subscribe(missing)
            except (redis.RedisError, OSError) as exc:
                log.debug("subscribing to wake-ups on %s failed: %r", node.key, exc)
                node.broken = True
                with contextlib.suppress(Exception):
                    node.pubsub.close()
                continue
            nodes[p] = node
        watched: set[int] = set()
        with self._cond:
            self._cond.wait_for(lambda: all(
                node.broken or set(wanted[p]) <= node.confirmed for p, node in nodes.items()),
                timeout=CONFIRM_S)
            for p, node in nodes.items():
                if not node.broken and set(wanted[p]) <= node.confirmed:
                    watched.add(p)
        return watched

    def _node(self, p: int) -> _Node | None:
        """The subscriber of the node that serves partition ``p`` now (made if need be)."""
        transport = self._parts[p]._transport
        pool = transport.pool
        if self._refused_until > time.monotonic():
            return None
        if transport.route is not None:
            with contextlib.suppress(redis.RedisError, OSError):
                transport.route.refresh()  # (nothing unless stale; no answer keeps it)
        key = node_key(self._parts[p])
        kwargs = dict(pool.connection_kwargs)
        if transport.route is not None:
            kwargs.update(route=None, host=key[0], port=key[1])
        kwargs["socket_timeout"] = READ_SLICE + transport.socket_timeout
        with self._cond:
            if self.closed:
                return None
            node = self._nodes.get(key)
            if node is None or node.broken:
                node = self._nodes[key] = _Node(self, key, redis.ConnectionPool(
                    connection_class=pool.connection_class, max_connections=1, **kwargs),
                    silence_s=transport.socket_timeout)
            return node

    # -- what the readers see -----------------------------------------------------------------
    def _on_message(self, node: _Node, message: dict[str, Any]) -> None:
        kind, channel = message.get("type"), message.get("channel")
        if not isinstance(channel, str):
            return
        with self._cond:
            watching = list(self._waiters.get(channel, ()))
            p = self._partition.get(channel)
            if kind == "smessage":
                if p is not None:
                    for waiter in watching:
                        waiter.fire(p)
            elif kind == "ssubscribe":
                node.confirmed.add(channel)
                self._cond.notify_all()
            elif kind == "sunsubscribe":  # not asked for: the slot moved to another node
                node.sent.discard(channel)
                node.confirmed.discard(channel)
                route = self._parts[p]._transport.route if p is not None else None
                if route is not None:
                    route.stale = True  # ask the cluster where the slot is now
                for waiter in watching:
                    waiter.lose()

    def _moved(self, node: _Node, exc: redis.exceptions.MovedError) -> None:
        """A subscription went where a partition's route pointed before its slot moved: tell
        the route (it would learn it at its next call), and have the waits on that partition
        subscribe again, there."""
        for p, part in enumerate(self._parts):
            route = part._transport.route
            if route is None or route.slot != int(exc.slot_id):
                continue
            route.move(exc.host, exc.port)
            with self._cond:
                for ch, of in list(self._partition.items()):
                    if of == p and ch in node.sent:
                        node.sent.discard(ch)
                        node.confirmed.discard(ch)
                        for waiter in self._waiters.get(ch, ()):
                            waiter.lose()
                self._cond.notify_all()

    def _refused(self, exc: redis.ResponseError) -> None:
        """Subscribing is refused (an ACL user without channel rights, say): waits use the
        wake lists for a while, and the hub tries again after REFUSED_PAUSE."""
        if self._refused_until < time.monotonic():
            log.warning("Redis refused a subscription to wake-up channels (%s): idle workers "
                        "on several partitions wait with a connection per partition", exc)
        self._refused_until = time.monotonic() + REFUSED_PAUSE

    def _lost(self, node: _Node) -> None:
        """``node``'s connection is gone: every wait it served must look again."""
        with self._cond:
            node.broken = True
            if self._nodes.get(node.key) is node:
                del self._nodes[node.key]
            for ch in list(node.sent):  # (a copy: a subscribing thread may add to it)
                for waiter in self._waiters.get(ch, ()):
                    waiter.lose()
            self._cond.notify_all()

    # -- life ---------------------------------------------------------------------------------
    def subscriptions(self) -> int:
        """Channels confirmed subscribed on live connections (for the tests)."""
        with self._cond:
            return sum(len(n.confirmed) for n in self._nodes.values() if not n.broken)

    def connections(self) -> int:
        with self._cond:
            return sum(1 for n in self._nodes.values() if not n.broken)

    def close(self) -> None:
        with self._cond:
            self.closed = True
            nodes, self._nodes = list(self._nodes.values()), {}
            for watching in self._waiters.values():
                for waiter in watching:
                    waiter.end()
            self._cond.notify_all()
        for node in nodes:
            node.broken = True
            with contextlib.suppress(Exception):
                node.pubsub.close()  # ends its reader's read at once

    def _after_fork_in_child(self) -> None:
        # The subscribers' sockets and threads are the parent's: forget them, unclosed.
        forking.keep_inherited(list(self._nodes.values()))
        self._nodes, self._waiters = {}, {}
        self._cond = threading.Condition()
