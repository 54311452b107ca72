"""A local Redis Cluster for the tests: 3 masters and 3 replicas on loopback, started once per
session from the session's tmp dir, and the operator's moves on it (a slot migration, a manual
failover, a master SIGKILLed until its replica takes over).

Ports are free ones picked at start (with their cluster bus ports, +10000, free too), not fixed
ones: other test runs on this machine may hold any fixed range. Only the processes started here
are ever stopped, by their own handles.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
from redis.crc import key_slot

T = TypeVar("T")
NODE_TIMEOUT_MS = 1000  # how long a silent master takes to be marked failed (then its replica runs)


class ClusterUnavailable(Exception):
    """The local cluster could not be started."""


def wait_until(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(n: int) -> list[int]:
    """``n`` free ports whose cluster bus port (+10000) is free too."""
    found: list[int] = []
    while len(found) < n:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + 10000 < 65536 and port not in found and _bindable(port + 10000):
            found.append(port)
    return found


class Node:
    def __init__(self, binary: str, root: Path, port: int) -> None:
        self.port = port
        self.dir = root / str(port)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log = self.dir / "redis.log"
        self.args = [
            binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(self.dir),
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            # A replica may always take over, however long its link was down (the tests kill
            # masters on purpose).
            "--cluster-replica-validity-factor", "0",
            # A replica's first sync at once (diskless, without the default 5 s wait for more
            # replicas to join it).
            "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0",
            "--appendonly", "no", "--save", "", "--daemonize", "no", "--logfile", str(self.log),
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def client(self, **kw: Any) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=5, socket_connect_timeout=1,
                           decode_responses=True, **kw)

    def kill(self) -> None:
        """SIGKILL this node's own process (no shutdown, no last replication)."""
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def info(self, section: str) -> dict[str, Any]:
        c = self.client()
        try:
            return dict(c.info(section))
        finally:
            c.close()

    def cluster(self, *args: Any) -> Any:
        c = self.client()
        try:
            return c.execute_command("CLUSTER", *args)
        finally:
            c.close()

    def node_id(self) -> str:
        return str(self.cluster("MYID"))


class LocalCluster:
    """3 masters + 3 replicas on loopback (``redis-cli --cluster create --cluster-replicas 1``)."""

    def __init__(self, root: Path, *, masters: int = 3, replicas: int = 1) -> None:
        binary = shutil.which("redis-server")
        if binary is None or shutil.which("redis-cli") is None:
            raise ClusterUnavailable("redis-server and redis-cli must be on PATH")
        self.root = root
        self.masters, self.replicas = masters, replicas
        self.nodes = [Node(binary, root, p) for p in free_ports(masters * (1 + replicas))]

    # -- life --------------------------------------------------------------------------------
    def start(self) -> LocalCluster:
        try:
            for node in self.nodes:
                node.start()
            for node in self.nodes:
                wait_until(lambda n=node: self._pings(n), 20, f"redis-server on {node.addr}")
            create = subprocess.run(
                ["redis-cli", "--cluster", "create", *[n.addr for n in self.nodes],
                 "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                capture_output=True, text=True, timeout=60)
            if create.returncode != 0:
                raise ClusterUnavailable(f"redis-cli --cluster create failed:\n{create.stdout}"
                                         f"\n{create.stderr}")
            self.wait_healthy(30)
        except (ClusterUnavailable, AssertionError, OSError, subprocess.SubprocessError) as exc:
            self.stop()
            raise ClusterUnavailable(f"{exc}\n{self.logs()}") from exc
        return self

    def stop(self) -> None:
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.proc.wait(10)

    @staticmethod
    def _pings(node: Node) -> bool:
        if not node.alive():
            raise AssertionError(f"redis-server on {node.addr} exited")
        c = node.client()
        try:
            return bool(c.ping())
        except redis.RedisError:
            return False
        finally:
            c.close()

    def logs(self, lines: int = 15) -> str:
        out = []
        for node in self.nodes:
            if node.log.exists():
                tail = node.log.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {node.addr} ---\n" + "\n".join(tail))
        return "\n".join(out)

    def wait_healthy(self, timeout: float = 30) -> None:
        """Every live node says cluster_state:ok and agrees on who owns every slot, with each
        master's replicas known, and every replica's link to its master up (synced): what a
        test may start from."""
        def healthy() -> bool:
            views = []
            for node in self.nodes:
                if not node.alive():
                    continue
                try:
                    if node.info("cluster").get("cluster_enabled") != 1:
                        return False
                    replication = node.info("replication")
                    if (replication.get("role") == "slave"
                            and replication.get("master_link_status") != "up"):
                        return False
                    c = node.client()
                    try:
                        if "cluster_state:ok" not in c.execute_command("CLUSTER", "INFO"):
                            return False
                        views.append(sorted((int(s[0]), int(s[1]), int(s[2][1]), len(s) - 3)
                                            for s in c.execute_command("CLUSTER", "SLOTS")))
                    finally:
                        c.close()
                except redis.RedisError:
                    return False
            return bool(views) and all(v == views[0] for v in views)

        wait_until(healthy, timeout, "the cluster to be healthy and agreed", interval=0.1)

    # -- who is who --------------------------------------------------------------------------
    def node(self, port: int) -> Node:
        return next(n for n in self.nodes if n.port == port)

    def owner(self, slot: int) -> Node:
        """The master that owns ``slot``, as a live node sees it."""
        for node in self.nodes:
            if not node.alive():
                continue
            with contextlib.suppress(redis.RedisError):
                for start, end, master, *_ in node.cluster("SLOTS"):
                    if int(start) <= slot <= int(end):
                        return self.node(int(master[1]))
        raise AssertionError(f"no live node knows the owner of slot {slot}")

    def replicas_of(self, master: Node) -> list[Node]:
        mid = master.node_id()
        return [n for n in self.nodes if n.alive() and n is not master
                and n.info("replication").get("role") == "slave"
                and n.cluster("NODES") and _master_of(n) == mid]

    def other_master(self, than: Node) -> Node:
        for node in self.nodes:
            if node is not than and node.alive() and node.info("replication")["role"] == "master":
                return node
        raise AssertionError("no other master")

    def url(self, prefix: str, *, seeds: list[Node] | None = None, query: str = "") -> str:
        hosts = ",".join(n.addr for n in (seeds or self.nodes))
        return f"redis+cluster://{hosts}/?prefix={prefix}{query}"

    def delete_prefix(self, prefix: str) -> None:
        """Delete an app's keys (all in its one slot, on the node that owns it)."""
        c = self.owner(self.slot_of(prefix)).client()
        try:  # only this app's keys (another prefix may share the slot)
            keys = list(c.scan_iter(match=f"{{{prefix}}}*", count=1000))
            for start in range(0, len(keys), 500):
                c.delete(*keys[start:start + 500])
        finally:
            c.close()

    @staticmethod
    def slot_of(prefix: str) -> int:
        return key_slot(("{" + prefix + "}").encode())

    # -- an operator's moves ----------------------------------------------------------------
    def migrate_slot(self, slot: int, dst: Node, *, batch: int = 1000,
                     between: Callable[[], None] | None = None) -> int:
        """Move ``slot`` to ``dst`` as ``redis-cli --cluster reshard`` does: IMPORTING on the
        target, MIGRATING on the source, MIGRATE the keys in batches, then SETSLOT NODE on
        both and every other master. ``between`` runs after each batch (a test's pause).
        Returns how many keys moved."""
        src = self.begin_migration(slot, dst)
        moved = 0
        c = src.client()
        try:
            while keys := c.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch):
                self.migrate_keys(src, dst, keys)
                moved += len(keys)
                if between is not None:
                    between()
        finally:
            c.close()
        self.end_migration(slot, dst)
        return moved

    def begin_migration(self, slot: int, dst: Node) -> Node:
        """SETSLOT IMPORTING on ``dst``, MIGRATING on the owner; returns the owner."""
        src = self.owner(slot)
        assert src is not dst
        dst.cluster("SETSLOT", slot, "IMPORTING", src.node_id())
        src.cluster("SETSLOT", slot, "MIGRATING", dst.node_id())
        return src

    @staticmethod
    def migrate_keys(src: Node, dst: Node, keys: list[str]) -> None:
        c = src.client()
        try:
            c.execute_command("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", *keys)
        finally:
            c.close()

    def end_migration(self, slot: int, dst: Node) -> None:
        """SETSLOT NODE on the target, the source, then every other live node."""
        dst_id = dst.node_id()
        src = self.owner(slot)
        for node in (dst, src, *[n for n in self.nodes if n not in (dst, src) and n.alive()]):
            with contextlib.suppress(redis.ResponseError):  # (replicas refuse it: fine)
                node.cluster("SETSLOT", slot, "NODE", dst_id)

    def manual_failover(self, replica: Node, timeout: float = 20) -> None:
        """CLUSTER FAILOVER on ``replica``: its master stops writes, the replica catches up
        with it, then takes over (nothing acknowledged is lost)."""
        replica.cluster("FAILOVER")
        wait_until(lambda: replica.info("replication").get("role") == "master", timeout,
                   f"{replica.addr} to become a master")

    def restart(self, node: Node) -> None:
        """Start a killed node again on its port and data dir (it rejoins from nodes.conf)."""
        assert not node.alive()
        node.start()
        wait_until(lambda: self._pings(node), 20, f"redis-server on {node.addr} again")


def _master_of(node: Node) -> str | None:
    for line in str(node.cluster("NODES")).splitlines():
        fields = line.split()
        if "myself" in fields[2]:
            return fields[3] if fields[3] != "-" else None
    return None


@contextlib.contextmanager
def local_cluster(root: Path) -> Iterator[LocalCluster]:
    """The cluster for a session: started here, its own processes killed at the end. If it
    cannot start: a skip locally, a failure under CI=true."""
    try:
        cluster = LocalCluster(root).start()
    except ClusterUnavailable as exc:
        reason = f"the local Redis Cluster could not start: {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    try:
        yield cluster
    finally:
        cluster.stop()


@contextlib.contextmanager
def cluster_store(cluster: LocalCluster) -> Iterator[str]:
    """A cluster URL with a fresh prefix (so a fresh slot, wherever it lands), every seed
    listed; the prefix's keys deleted afterwards on whichever node owns its slot then."""
    prefix = f"conveyor_test_{uuid.uuid4().hex[:12]}"
    try:
        yield cluster.url(prefix)
    finally:
        cluster.delete_prefix(prefix)
