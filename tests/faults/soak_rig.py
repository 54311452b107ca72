"""What the R13 soak (test_soak.py) measures and the faults it injects, kept apart from the test.

* :class:`Sampler` -- a thread that, every ``interval`` seconds, reads for every live worker
  process of a :class:`harness.Cluster` its ``VmRSS`` and ``RssAnon`` (``/proc/<pid>/status``)
  and the store handles it holds: on SQLite the file descriptors open on the database file
  (one per SQLite connection), on PostgreSQL and Redis its TCP sockets to the server
  (``/proc/<pid>/fd`` matched against ``/proc/net/tcp``); and, from the server's side, the
  sessions or clients per name (PostgreSQL ``pg_stat_activity.application_name``, Redis
  ``CLIENT LIST`` ``name``; each worker connects with its own name) and the server's total
  (PostgreSQL client backends, Redis ``INFO clients`` ``connected_clients``).
* :class:`SoakNemesis` -- a thread that, every ``interval`` x U(0.8, 1.2) seconds, injects one
  fault drawn at random (each kind once per round, in a random order, so every kind happens):
  ``kill`` (SIGKILL a worker other than the sentinel, start a new one in its place), ``pause``
  (SIGSTOP a worker past its lease, then SIGCONT), ``pg_terminate`` (``pg_terminate_backend``
  on every worker session) and ``client_kill`` (Redis ``CLIENT KILL`` of every worker
  connection). Each fault is a :class:`Fault` with the time it began and the time it healed.
* :func:`percentile`, :func:`spread` -- small figures for the report.

Only processes this suite started are signalled (by pid, through their Popen handles), and
only the private servers the fault fixtures started are queried or have connections killed:
the shared PostgreSQL (5432) and Redis (6379) are refused outright.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import re
import signal
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from faultstore import FaultStore
from harness import Cluster, is_stopped
from processrig import Proc, wait_until

SHARED_PORTS = {5432, 6379}  # the machine's own servers: never touched
WORKER_NAME = re.compile(r"w\d+")  # harness.Cluster names its workers w1, w2, ...


# -- /proc readings ------------------------------------------------------------------------------
def rss_kb(pid: int) -> tuple[int, int] | None:
    """(VmRSS, RssAnon) of ``pid`` in KiB, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    vals = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "RssAnon"):
            vals[key] = int(rest.split()[0])
    if "VmRSS" not in vals:  # a zombie has no memory left
        return None
    return vals["VmRSS"], vals.get("RssAnon", 0)


def fd_targets(pid: int) -> list[str]:
    """What each open file descriptor of ``pid`` points at (``socket:[inode]``, a path, ...)."""
    out: list[str] = []
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return out
    for fd in names:
        with contextlib.suppress(OSError):
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return out


def tcp_sockets_to(port: int) -> set[int]:
    """Inodes of the machine's TCP sockets whose remote end is 127.0.0.1:``port`` (client sides)."""
    found: set[int] = set()
    want = f"0100007F:{port:04X}"
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            parts = line.split()
            if len(parts) > 9 and parts[2] == want:
                found.add(int(parts[9]))
    return found


def count_handles(pid: int, *, db: Path | None, server_port: int | None,
                  sockets: set[int] | None) -> int | None:
    """The store handles ``pid`` holds: fds on the SQLite file ``db``, or sockets to the server."""
    targets = fd_targets(pid)
    if not targets:
        return None
    if db is not None:
        return sum(1 for t in targets if t == str(db))
    assert sockets is not None and server_port is not None
    return sum(1 for t in targets if t.startswith("socket:[") and int(t[8:-1]) in sockets)


# -- the server's view ------------------------------------------------------------------------------
class ServerView:
    """Connections per client name on the store's private server, and its total."""

    def __init__(self, store: FaultStore, name: str) -> None:
        self.store, self.name = store, name
        self._pg: psycopg.Connection[tuple[object, ...]] | None = None
        self._redis = None
        self.failures = 0  # reads that got no answer (then the connection is made anew)
        if store.pg is not None:
            assert store.pg.port not in SHARED_PORTS, "refusing to watch the shared PostgreSQL"
            self.port: int | None = store.pg.port
            self._pg = self._pg_connect()
        elif store.redis is not None:
            assert store.redis.port not in SHARED_PORTS, "refusing to watch the shared Redis"
            self.port = store.redis.port
            self._redis = store.redis.client()
            self._redis.client_setname(name)
        else:
            self.port = None

    def _pg_connect(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.store.with_app_name(self.name), autocommit=True, connect_timeout=5)

    def read(self) -> tuple[dict[str, int], int] | None:
        """(connections by name, server total), or None on SQLite / if the server did not answer."""
        try:
            if self._pg is not None:
                rows = self._pg.execute(
                    "SELECT coalesce(application_name, ''), count(*) FROM pg_stat_activity "
                    "WHERE backend_type = 'client backend' GROUP BY 1").fetchall()
                by_name = {str(r[0]): int(str(r[1])) for r in rows}
                return by_name, sum(by_name.values())
            if self._redis is not None:
                by_name = {}
                for c in self._redis.client_list():
                    by_name[c.get("name", "")] = by_name.get(c.get("name", ""), 0) + 1
                total = int(self._redis.info("clients")["connected_clients"])
                return by_name, total
        except Exception:
            self.failures += 1
            if self._pg is not None:
                with contextlib.suppress(Exception):
                    self._pg.close()
                with contextlib.suppress(Exception):
                    self._pg = self._pg_connect()
            return None
        return None

    def close(self) -> None:
        if self._pg is not None:
            self._pg.close()
        if self._redis is not None:
            self._redis.close()


# -- the sampler ---------------------------------------------------------------------------------
@dataclass
class Sample:
    t: float  # time.time() once every read is done
    rss: dict[str, tuple[int, int, int]]  # worker name -> (pid, VmRSS KiB, RssAnon KiB)
    handles: dict[str, int]  # worker name -> store handles it holds (client side)
    server: dict[str, int] | None  # connection name -> count, as the server sees them
    server_total: int | None
    stopped: list[str]  # workers SIGSTOPped at the time
    t0: float = 0.0  # time.time() before the first read: the sample describes [t0, t]


class Sampler:
    """Samples every ``interval`` s until stopped (see the module docstring)."""

    def __init__(self, cluster: Cluster, store: FaultStore, *, interval: float, sampler_name: str) -> None:
        self.cluster, self.store, self.interval = cluster, store, interval
        self.view = ServerView(store, sampler_name)
        self.samples: list[Sample] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)

    def sample(self) -> Sample:
        t0 = time.time()
        port = self.view.port
        sockets = tcp_sockets_to(port) if port is not None else None
        rss: dict[str, tuple[int, int, int]] = {}
        handles: dict[str, int] = {}
        stopped = []
        for p in self.cluster.live():
            r = rss_kb(p.pid)
            h = count_handles(p.pid, db=self.store.sqlite_path, server_port=port, sockets=sockets)
            if r is None or h is None:
                continue
            rss[p.name] = (p.pid, r[0], r[1])
            handles[p.name] = h
            if is_stopped(p.pid):
                stopped.append(p.name)
        seen = self.view.read()
        return Sample(time.time(), rss, handles, seen[0] if seen else None, seen[1] if seen else None, stopped, t0)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            try:
                self.samples.append(self.sample())
            except Exception:
                self.errors.append(traceback.format_exc())
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - t)))

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)
        self.view.close()


# -- faults --------------------------------------------------------------------------------------
@dataclass
class Fault:
    kind: str
    start: float  # time.time() when it began
    healed: float | None = None  # when it was over (the new worker up, SIGCONT sent, ...)
    victims: list[str] = field(default_factory=list)  # worker names hit
    count: int = 0  # sessions / clients killed
    spawned: str | None = None  # the replacement of a killed worker
    skipped: int = 0  # pause attempts given up because the worker held a lock


class SoakNemesis:
    """One fault every ``interval`` x U(0.8, 1.2) s, kinds from ``kinds`` in random rounds.

    ``sentinel`` is never SIGKILLed (its RSS is watched for the whole run). ``pause_s``: how long
    a paused worker stays stopped. ``pause_guard(proc)`` False: the stopped worker holds what
    every other writer waits for (SQLite's write lock, an open PostgreSQL transaction), so it is
    resumed at once and another moment tried (counted as skipped)."""

    def __init__(self, cluster: Cluster, store: FaultStore, rng: random.Random, *, kinds: Sequence[str],
                 interval: float, pause_s: float, sentinel: str, worker_prefix: str,
                 pause_guard: Callable[[Proc], bool] | None = None) -> None:
        self.cluster, self.store, self.rng = cluster, store, rng
        self.kinds, self.interval, self.pause_s = list(kinds), interval, pause_s
        self.sentinel, self.prefix, self.pause_guard = sentinel, worker_prefix, pause_guard
        self.faults: list[Fault] = []
        self.errors: list[str] = []
        self._round: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-nemesis", daemon=True)

    def is_worker(self, client_name: str) -> bool:
        """A worker's connection (``<prefix>w<n>``), not the producer's or the sampler's."""
        return client_name.startswith(self.prefix) and WORKER_NAME.fullmatch(client_name[len(self.prefix):]) is not None

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.faults:
            out[f.kind] = out.get(f.kind, 0) + 1
        return out

    def _next_kind(self) -> str:
        if not self._round:
            self._round = self.rng.sample(self.kinds, len(self.kinds))
        return self._round.pop()

    def _run(self) -> None:
        while not self._stop.wait(self.interval * self.rng.uniform(0.8, 1.2)):
            kind = self._next_kind()
            try:
                getattr(self, f"_{kind}")()
            except Exception:
                self.errors.append(f"{kind}: {traceback.format_exc()}")

    def _candidates(self, *, spare_sentinel: bool) -> list[Proc]:
        return [p for p in self.cluster.started() if not (spare_sentinel and p.name == self.sentinel)]

    def _kill(self) -> None:
        victims = self._candidates(spare_sentinel=True)
        if not victims:
            return
        victim = self.rng.choice(victims)
        fault = Fault("kill", time.time(), victims=[victim.name])
        self.faults.append(fault)
        with contextlib.suppress(ProcessLookupError):
            victim.popen.kill()
        victim.popen.wait(10)
        new = self.cluster.respawn(victim, wait=True)
        fault.spawned = new.name
        fault.healed = time.time()

    def _pause(self) -> None:
        victims = self._candidates(spare_sentinel=False)
        if not victims:
            return
        victim = self.rng.choice(victims)
        fault = Fault("pause", time.time(), victims=[victim.name])
        for _ in range(100):
            with contextlib.suppress(ProcessLookupError):
                victim.send(signal.SIGSTOP)
            wait_until(lambda: is_stopped(victim.pid) or not victim.alive(), 5, f"{victim.name} to stop")
            if self.pause_guard is None or self.pause_guard(victim):
                break
            with contextlib.suppress(ProcessLookupError):
                victim.send(signal.SIGCONT)
            fault.skipped += 1
            time.sleep(0.02)
        else:
            self.errors.append(f"pause: {victim.name} held a lock at each of 100 tries")
            return
        fault.start = time.time()
        self.faults.append(fault)
        try:
            self._stop.wait(self.pause_s)
        finally:
            with contextlib.suppress(ProcessLookupError):
                victim.send(signal.SIGCONT)
            fault.healed = time.time()

    def _pg_terminate(self) -> None:
        assert self.store.pg is not None and self.store.pg.port not in SHARED_PORTS
        fault = Fault("pg_terminate", time.time())
        self.faults.append(fault)
        with psycopg.connect(self.store.pg.url, autocommit=True, connect_timeout=5) as conn:
            rows = conn.execute(
                "SELECT application_name, pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name ~ %s AND pid <> pg_backend_pid()",
                [f"^{re.escape(self.prefix)}w[0-9]+$"]).fetchall()
        fault.count = sum(1 for _, ok in rows if ok)
        fault.victims = sorted({str(name)[len(self.prefix):] for name, _ in rows})
        fault.healed = time.time()

    def _client_kill(self) -> None:
        assert self.store.redis is not None and self.store.redis.port not in SHARED_PORTS
        fault = Fault("client_kill", time.time())
        self.faults.append(fault)
        client = self.store.redis.client()
        try:
            mine = [c for c in client.client_list() if self.is_worker(c.get("name", ""))]
            for c in mine:
                fault.count += int(client.execute_command("CLIENT", "KILL", "ID", c["id"]))  # type: ignore[no-untyped-call]
        finally:
            client.close()
        fault.victims = sorted({c["name"][len(self.prefix):] for c in mine})
        fault.healed = time.time()

    def start(self) -> SoakNemesis:
        self._thread.start()
        return self

    def stop(self) -> None:
        """No new fault; a pause in progress ends now (SIGCONT). Idempotent."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(60)
            assert not self._thread.is_alive(), "the nemesis did not stop"


# -- figures -------------------------------------------------------------------------------------
def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ascending values, nearest rank."""
    if not sorted_values:
        return math.nan
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def spread(values: Sequence[float]) -> str:
    return f"{min(values):g}..{max(values):g}" if values else "-"

