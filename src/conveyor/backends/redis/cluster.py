"""Redis Cluster: the cluster URL, and the route to the node that serves the app's slot.

Every key of an app shares one hash tag (``{prefix}``), so the whole app lives in one slot, and
one node serves it at a time. A backend on a cluster URL keeps talking to one node, as on a
standalone server; what changes is that the node can change under it. ``Route`` is where that
node is: each connection of the transport (its pools', its own script connections, the loop
claims') reads the route when it connects, and one made for an older route is closed and made
again, so moving the route moves them all. The route moves when a node answers MOVED (which
names the node that serves the slot now) and when a connection fails (the route is then asked
again of the cluster: a failover elects another node). What each reply means for a call that
got it (retried at once, after a pause, or reported) is Transport.call's.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import redis
from redis.crc import key_slot

from ...errors import ConfigurationError

SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
REFRESH_GAP = 0.05  # seconds between two askings of the cluster (a failed node fails fast)
MAX_KNOWN = 64  # nodes remembered beside the seeds, to ask when the seeds are down


def is_cluster_url(url: str) -> bool:
    return urlsplit(url).scheme in SCHEMES


def seeds_of(url: str) -> list[tuple[str, int]]:
    """The ``host:port`` pairs of a cluster URL, in order (port 6379 if left out)."""
    hosts = urlsplit(url).netloc.rpartition("@")[2]
    seeds = []
    for part in hosts.split(","):
        part = part.strip()
        if part.startswith("["):  # an IPv6 address: [::1]:7000
            host, _, rest = part[1:].partition("]")
            port_text = rest[1:] if rest.startswith(":") else ""
        else:
            host, _, port_text = part.partition(":")
        if not host:
            raise ConfigurationError(f"{part!r}: a cluster URL lists host:port pairs, "
                                     "comma-separated")
        try:
            port = int(port_text) if port_text else 6379
        except ValueError:
            raise ConfigurationError(f"{part!r}: the port must be a number") from None
        if not 0 < port < 65536:
            raise ConfigurationError(f"{part!r}: the port must be 1-65535")
        seeds.append((host, port))
    if not seeds:
        raise ConfigurationError("a cluster URL needs at least one host:port")
    return seeds


def check_cluster_url(url: str, shown: str) -> None:
    """Refuse what a cluster cannot do: a database other than 0 (a cluster has only db 0, and
    SELECT of another is an error on every connection)."""
    parts = urlsplit(url)
    seeds_of(url)
    db_text = parts.path.strip("/") or dict(parse_qsl(parts.query)).get("db", "0")
    if db_text not in ("", "0"):
        raise ConfigurationError(
            f"{shown!r}: Redis Cluster has only database 0; leave the /{db_text} out of the URL "
            "(use the prefix option to keep apps apart)")


def node_url(url: str, host: str, port: int) -> str:
    """The plain ``redis://`` (``rediss://``) URL of one node of a cluster URL: its user,
    password, options, and the node's address. redis-py makes connections from it."""
    parts = urlsplit(url)
    userinfo, at, _ = parts.netloc.rpartition("@")
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return parts._replace(scheme=SCHEMES[parts.scheme], netloc=f"{userinfo}{at}{address}",
                          path="/0").geturl()


def slot_of(prefix: str) -> int:
    """The app's slot: that of its hash tag, which every one of its keys carries."""
    return int(key_slot(("{" + prefix + "}").encode()))


class ClusterDisabled(redis.ResponseError):
    """A seed of a cluster URL is a standalone server (cluster support disabled)."""


Probe = Callable[[str, int], Any]  # (host, port) -> that node's CLUSTER SLOTS reply


class Route:
    """Which node serves the app's slot now: ``target`` is its host and port, and a gen that
    grows each time they change (a connection made for an older gen is made again), set as one
    tuple so a reader never sees a host of one and a gen of another. ``stale`` says the cluster
    should be asked again before the next connection (after a connection failed)."""

    def __init__(self, seeds: Sequence[tuple[str, int]], slot: int, probe: Probe) -> None:
        self.seeds = list(seeds)
        self.known: list[tuple[str, int]] = []  # the other nodes the last map named
        self.slot = slot
        self.target: tuple[str, int, int] = (*self.seeds[0], 0)
        self.stale = True  # asked before the first connection
        self._probe = probe
        self._lock = threading.Lock()
        self._asked_at = -math.inf

    def move(self, host: str, port: int) -> None:
        """Go to ``host:port`` (a MOVED reply's node; an empty host means the same host)."""
        with self._lock:
            self._go(host or self.target[0], port)
            self.stale = False

    @property
    def address(self) -> tuple[str, int]:
        host, port, _ = self.target
        return host, port

    def _go(self, host: str, port: int) -> None:
        old_host, old_port, gen = self.target
        if (host, port) != (old_host, old_port):
            self.target = (host, port, gen + 1)

    def refresh(self) -> None:
        """If stale, ask the nodes who serves the slot: the seeds and the nodes learned from
        earlier answers first, the node the route points at last (it is the one that failed).
        The first answer that names an owner is taken. No answer leaves the route as it was
        (its connections then fail, and the route is asked again, at most every
        REFRESH_GAP)."""
        if not self.stale:
            return
        with self._lock:
            now = time.monotonic()
            if not self.stale or now - self._asked_at < REFRESH_GAP:
                return
            self._asked_at = now
            self.stale = False  # one asking per failure: a failure while asking sets it again
            current = self.address
            order = [n for n in dict.fromkeys([*self.seeds, *self.known]) if n != current]
            for host, port in [*order, current]:
                try:
                    reply = self._probe(host, port)
                except ClusterDisabled:
                    self.stale = True  # every connection meets it, until the URL is fixed
                    raise
                except (redis.RedisError, OSError):
                    continue  # down, or (ACL) not allowed CLUSTER SLOTS: MOVED still steers
                owner, nodes = read_slots(reply, self.slot, host)
                self.known = [n for n in nodes if n not in self.seeds][:MAX_KNOWN]
                if owner is not None:
                    self._go(*owner)
                    return

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        self.stale = True


def read_slots(reply: Any, slot: int, asked: str,
               ) -> tuple[tuple[str, int] | None, list[tuple[str, int]]]:
    """From a CLUSTER SLOTS reply: the master that serves ``slot`` (None if none does), and
    every node named. A node shown without an address ("" or "?") is on the host asked."""
    owner = None
    nodes: list[tuple[str, int]] = []
    for entry in reply or []:
        start, end, *members = entry
        for member in members:
            host = _text(member[0])
            address = (asked if host in ("", "?") else host, int(member[1]))
            if address not in nodes:
                nodes.append(address)
        if members and int(start) <= slot <= int(end):
            host = _text(members[0][0])
            owner = (asked if host in ("", "?") else host, int(members[0][1]))
    return owner, nodes


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
