"""What bounds a drain: worker CPU, store-server CPU and the machine's busy share over its window.

A drain's rate is jobs / window, the window taken from the store's clock or the workers' (epoch
seconds, this machine's clock). To say whether that window was spent computing or waiting, a
:class:`CpuSampler` thread in the driver reads, every ``SAMPLE_EVERY_S``:

- ``/proc/stat``'s first line (every core's user, nice, system, idle, iowait, irq, softirq, steal
  ticks): the machine's busy share;
- ``/proc/<pid>/stat`` (user + system ticks, all threads) of every descendant of the driver
  process: during a drain the only ones are the worker processes (a worker command that forks,
  such as Dramatiq's, is counted with its children);
- the store server's processes, where the store is a server on this machine: redis-server (the
  pid its ``INFO server`` gives), PostgreSQL (the postmaster and all its children, with the CPU
  of backends that exited, which the kernel adds to the postmaster's ``cutime``/``cstime``).

After the drain, :meth:`CpuSampler.window` interpolates those counters at the window's first and
last instant (linearly between the two samples around each), so process start-up and the
driver's wait for completion fall outside the figures, as they fall outside the rate. Ticks are
1/100 s: over a window under a second the figures are coarse (the note says so).

The server figures count everything that server did meanwhile, other clients' work included;
the machine's share counts everything the machine did (hence the "rest" share in the note).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

# A sample costs the driver about 0.1-0.2 ms (a dozen small /proc reads): 1 % of a core at most.
SAMPLE_EVERY_S = 0.025
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# The machine counts as CPU-bound at or above this busy share of all its cores over the window.
# Not 100 %: /proc/stat books a core idle for every tick in which nothing was runnable on it, and
# a drain whose processes hand work to each other (worker -> store server -> worker) leaves such
# gaps even when no core has spare time to speak of; saturated drains measured here on 2 cores
# read 92-99 %. Below ~90 % at least a tenth of the machine was idle: something else set the pace.
CPU_BOUND_BUSY = 0.90
# One process counts as bound by its own CPU at or above this share of ONE core (a Python worker
# cannot use more than about one core for its Python code, GIL; redis-server runs commands on one
# thread): then the machine may be half idle and the drain still bound by that process's CPU.
PROCESS_BOUND_SHARE = 0.90
# A CPU-bound verdict says how much of the cores went to processes outside the run (neither
# workers, server nor driver) from this share up: on a shared machine they, not the system
# measured, may be what took the CPU.
OTHERS_SHARE_SAID = 0.2
# Below this window length the figures rest on few 10 ms ticks and few samples: say so.
COARSE_WINDOW_S = 1.0
# Below this one (a --quick drain of a fast system) they are too few to name a bound at all.
MIN_VERDICT_WINDOW_S = 0.25


# -- pure parsing and arithmetic (tested with fixed inputs) -----------------------------------
@dataclass(frozen=True)
class MachineTicks:
    busy: int  # user + nice + system + irq + softirq + steal
    total: int  # busy + idle + iowait
    iowait: int
    cores: int


def parse_proc_stat(text: str) -> MachineTicks:
    """The machine's cumulative ticks from the text of ``/proc/stat``."""
    lines = text.splitlines()
    f = [int(x) for x in lines[0].split()[1:]]
    f += [0] * (8 - len(f))
    user, nice, system, idle, iowait, irq, softirq, steal = f[:8]
    # guest and guest_nice (fields 9-10) are already inside user and nice
    busy = user + nice + system + irq + softirq + steal
    cores = sum(1 for ln in lines[1:] if ln.startswith("cpu") and ln[3:4].isdigit())
    return MachineTicks(busy, busy + idle + iowait, iowait, cores or (os.cpu_count() or 1))


def busy_share(a: MachineTicks, b: MachineTicks) -> float | None:
    """The busy fraction of all cores between two readings (0..1), or None if no time passed."""
    total = b.total - a.total
    return None if total <= 0 else (b.busy - a.busy) / total


@dataclass(frozen=True)
class ProcTicks:
    ppid: int
    user: int  # utime, all threads
    system: int  # stime, all threads
    children: int  # cutime + cstime: waited-for children that exited

    @property
    def own(self) -> int:
        return self.user + self.system


def parse_pid_stat(text: str) -> ProcTicks:
    """``/proc/<pid>/stat``: the command name may hold spaces and parentheses, so split after
    the last ``)``."""
    f = text.rsplit(")", 1)[1].split()
    # f[0] is field 3 (state): ppid is field 4, utime..cstime fields 14-17
    return ProcTicks(int(f[1]), int(f[11]), int(f[12]), int(f[13]) + int(f[14]))


def per_job_ms(cpu_s: float | None, jobs: int) -> float | None:
    """CPU milliseconds per job, or None."""
    if cpu_s is None or jobs <= 0:
        return None
    return cpu_s / jobs * 1000


def interpolate(ts: list[float], vs: list[float], t: float) -> float:
    """The value of a sampled, non-decreasing counter at ``t``: linear between the samples
    around it, the first or last sample outside them."""
    if not ts:
        raise ValueError("no samples")
    if t <= ts[0]:
        return vs[0]
    if t >= ts[-1]:
        return vs[-1]
    lo, hi = 0, len(ts) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ts[mid] <= t:
            lo = mid
        else:
            hi = mid
    span = ts[hi] - ts[lo]
    if span <= 0:
        return vs[hi]
    return vs[lo] + (vs[hi] - vs[lo]) * (t - ts[lo]) / span


def pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def verdict(
    busy: float | None,
    cores: int,
    worker_max_core: float | None = None,
    server_max_core: float | None = None,
    server: str = "",
    waits: str = "round trips / locks",
) -> str:
    """One phrase: what bounded the drain, from the machine's busy share over the window and
    the busiest worker process's (and server process's) share of one core.

    ``waits`` names what a drain that is not CPU-bound plausibly waits on (not measured)."""
    if busy is None:
        return "bound: not measured"
    # compared as shown (whole per cent), so the phrase never reads "not CPU-bound (90 % busy)"
    busy = round(busy, 2)
    worker_max_core = None if worker_max_core is None else round(worker_max_core, 2)
    server_max_core = None if server_max_core is None else round(server_max_core, 2)
    machine = f"machine {pct(busy)} busy of {cores} cores"
    if busy >= CPU_BOUND_BUSY:
        return f"bound: CPU ({machine})"
    if worker_max_core is not None and worker_max_core >= PROCESS_BOUND_SHARE:
        return f"bound: one worker process's CPU ({pct(worker_max_core)} of a core; {machine})"
    if server and server_max_core is not None and server_max_core >= PROCESS_BOUND_SHARE:
        return f"bound: {server} CPU ({pct(server_max_core)} of a core; {machine})"
    return f"not CPU-bound ({machine}): {waits}"


@dataclass
class Sample:
    t: float  # time.time()
    machine: MachineTicks
    workers: dict[int, int]  # pid -> own ticks, every descendant of the driver
    server_total: int | None  # the server's ticks, exited children included
    server: dict[int, int]  # pid -> own ticks
    driver: int | None = None  # the driver process's own ticks (producer, polling, this sampler)


def _series(samples: list[Sample], attr: str) -> dict[int, list[float]]:
    """Per pid, its ticks at every sample: before it was first seen, its first value (its
    start-up is booked before the window); after it was last seen, its last value (a stopped
    worker keeps what it used, so no counter goes down)."""
    pids: list[int] = []
    for s in samples:
        for p in getattr(s, attr):
            if p not in pids:
                pids.append(p)
    out: dict[int, list[float]] = {}
    for p in pids:
        seen = [getattr(s, attr).get(p) for s in samples]
        first = next(v for v in seen if v is not None)
        vals: list[float] = []
        last = float(first)
        for v in seen:
            if v is not None:
                last = float(max(v, last))
            vals.append(last)
        out[p] = vals
    return out


@dataclass
class Window:
    """The CPU figures of one drain window."""

    seconds: float
    jobs: int
    cores: int
    busy: float | None
    iowait: float | None
    worker_cpu_s: float | None
    worker_processes: int
    worker_max_core: float | None  # the busiest worker process, share of one core
    server_cpu_s: float | None
    server_max_core: float | None
    driver_cpu_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def window_of(samples: list[Sample], t0: float, t1: float, jobs: int) -> Window | None:
    """The figures over ``[t0, t1]`` from samples taken around it (pure)."""
    if len(samples) < 2 or t1 <= t0:
        return None
    ts = [s.t for s in samples]
    if ts[0] > t0 + SAMPLE_EVERY_S * 4 or ts[-1] < t1 - SAMPLE_EVERY_S * 4:
        return None  # the sampler did not cover the window
    cores = samples[-1].machine.cores
    seconds = t1 - t0

    def delta(vs: list[float]) -> float:
        return interpolate(ts, vs, t1) - interpolate(ts, vs, t0)

    total = delta([float(s.machine.total) for s in samples])
    busy = delta([float(s.machine.busy) for s in samples]) / total if total > 0 else None
    iowait = delta([float(s.machine.iowait) for s in samples]) / total if total > 0 else None

    def processes(attr: str) -> tuple[float | None, float | None, int]:
        per = {p: delta(vs) / CLK_TCK for p, vs in _series(samples, attr).items()}
        active = {p: v for p, v in per.items() if v > 0}
        if not per:
            return None, None, 0
        return sum(per.values()), max(per.values()) / seconds, len(active)

    worker_cpu, worker_max, nproc = processes("workers")
    server_cpu: float | None = None
    server_max: float | None = None
    if all(s.server_total is not None for s in samples):
        server_cpu = delta([float(s.server_total or 0) for s in samples]) / CLK_TCK
        _, server_max, _ = processes("server")
    driver_cpu: float | None = None
    if all(s.driver is not None for s in samples):
        driver_cpu = delta([float(s.driver or 0) for s in samples]) / CLK_TCK
    return Window(
        seconds,
        jobs,
        cores,
        busy,
        iowait,
        worker_cpu,
        nproc,
        worker_max,
        server_cpu,
        server_max,
        driver_cpu,
    )


def describe(
    w: Window | None, server: str = "", waits: str = "round trips / locks"
) -> tuple[str, dict[str, Any]]:
    """The note fragment and the row's extra numbers for a window (pure)."""
    if w is None:
        return "CPU not measured (no samples over the window)", {"bound": "bound: not measured"}
    extra: dict[str, Any] = {"cpu_window_s": round(w.seconds, 4), "machine_cores": w.cores}
    parts = []
    worker_ms = per_job_ms(w.worker_cpu_s, w.jobs)
    if worker_ms is not None:
        extra["worker_cpu_ms_per_job"] = worker_ms
        extra["worker_processes_seen"] = w.worker_processes
        parts.append(f"worker CPU {worker_ms:.3f} ms/job")
    server_ms = per_job_ms(w.server_cpu_s, w.jobs)
    if server and server_ms is not None:
        extra["server_cpu_ms_per_job"] = server_ms
        extra["server"] = server
        parts.append(f"{server} CPU {server_ms:.3f} ms/job")
    if w.busy is not None:
        extra["machine_busy"] = round(w.busy, 4)
        shares = []
        capacity = w.seconds * w.cores
        rest = w.busy
        if w.worker_cpu_s is not None:
            extra["workers_share"] = round(w.worker_cpu_s / capacity, 4)
            shares.append(f"workers {pct(extra['workers_share'])}")
            rest -= extra["workers_share"]
        if server and w.server_cpu_s is not None:
            extra["server_share"] = round(w.server_cpu_s / capacity, 4)
            shares.append(f"{server} {pct(extra['server_share'])}")
            rest -= extra["server_share"]
        if w.driver_cpu_s is not None:
            extra["driver_share"] = round(w.driver_cpu_s / capacity, 4)
            shares.append(f"driver {pct(extra['driver_share'])}")
            rest -= extra["driver_share"]
        extra["others_share"] = round(max(0.0, rest), 4)
        shares.append(f"rest of the machine {pct(extra['others_share'])}")
        parts.append(f"CPU of the {w.cores} cores: {', '.join(shares)}")
    if w.iowait is not None:
        extra["machine_iowait"] = round(w.iowait, 4)
    if w.worker_max_core is not None:
        extra["worker_max_core"] = round(w.worker_max_core, 4)
    if w.server_max_core is not None and server:
        extra["server_max_core"] = round(w.server_max_core, 4)
    if w.seconds < MIN_VERDICT_WINDOW_S:
        extra["bound"] = f"bound: not judged (a {w.seconds:.2f} s window is too short)"
        parts.append(extra["bound"])
    else:
        extra["bound"] = verdict(
            w.busy, w.cores, w.worker_max_core, w.server_max_core, server, waits
        )
        others = extra.get("others_share", 0.0)
        if extra["bound"].startswith("bound: CPU") and others >= OTHERS_SHARE_SAID:
            # inside the parenthesis: "(machine 95 % busy of 2 cores, 50 % by other processes)"
            extra["bound"] = extra["bound"][:-1] + f", {pct(others)} by other processes)"
        parts.append(extra["bound"])
        if w.seconds < COARSE_WINDOW_S:
            parts.append(f"coarse: a {w.seconds:.2f} s window")
    return "; ".join(parts), extra


# -- reading /proc -----------------------------------------------------------------------------
def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def children(pid: int) -> list[int]:
    """The live children of ``pid`` (of every thread of it)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        text = _read(f"/proc/{pid}/task/{tid}/children")
        if text:
            out += [int(x) for x in text.split()]
    return out


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = children(pid)
    while todo:
        p = todo.pop()
        if p not in out:
            out.append(p)
            todo += children(p)
    return out


def proc_ticks(pid: int) -> ProcTicks | None:
    text = _read(f"/proc/{pid}/stat")
    return None if text is None else parse_pid_stat(text)


def machine_ticks() -> MachineTicks | None:
    text = _read("/proc/stat")
    return None if text is None else parse_proc_stat(text)


class Server:
    """A store server's processes on this machine: ``root`` and its descendants."""

    def __init__(self, name: str, root: int | None, tree: bool) -> None:
        self.name, self.root, self.tree = name, root, tree

    def read(self) -> tuple[int | None, dict[int, int]]:
        if self.root is None:
            return None, {}
        top = proc_ticks(self.root)
        if top is None:
            return None, {}
        own = {self.root: top.own}
        total = top.own
        if self.tree:  # exited children's CPU moves into the root's cutime when it waits for them
            total += top.children
            for p in descendants(self.root):
                t = proc_ticks(p)
                if t is not None:
                    own[p] = t.own
                    total += t.own
        return total, own


def redis_server(r: Any) -> Server:
    """redis-server, by the pid its INFO gives, if that pid is a redis process here."""
    pid: int | None = None
    with contextlib.suppress(Exception):
        pid = int(r.info("server")["process_id"])
        comm = _read(f"/proc/{pid}/comm") or ""
        if "redis" not in comm:
            pid = None  # another pid namespace (a container): not ours to read
    return Server("redis-server", pid, tree=False)


def postgres_server(conn: Any) -> Server:
    """The PostgreSQL server: the postmaster (the parent of this connection's backend) and every
    process it started (backends, WAL writer, checkpointer, autovacuum)."""
    pid: int | None = None
    with contextlib.suppress(Exception):
        backend = int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
        t = proc_ticks(backend)
        comm = _read(f"/proc/{backend}/comm") or ""
        if t is not None and "postgres" in comm:
            pid = t.ppid
    return Server("PostgreSQL", pid, tree=True)


class CpuSampler:
    """Samples the machine, the driver's descendants and a server until stopped; use as
    ``with CpuSampler(server) as cpu: ...`` then ``cpu.window(t0, t1, jobs)``."""

    def __init__(self, server: Server | None = None, every: float = SAMPLE_EVERY_S) -> None:
        self.server = server
        self.every = every
        self.samples: list[Sample] = []
        self.me = os.getpid()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def sample(self) -> None:
        m = machine_ticks()
        if m is None:
            return
        workers: dict[int, int] = {}
        for p in descendants(self.me):
            t = proc_ticks(p)
            if t is not None:
                workers[p] = t.own
        total, own = self.server.read() if self.server else (None, {})
        me = proc_ticks(self.me)
        self.samples.append(
            Sample(time.time(), m, workers, total, own, None if me is None else me.own)
        )

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def __enter__(self) -> CpuSampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sample()

    def window(self, t0: float, t1: float, jobs: int) -> Window | None:
        return window_of(list(self.samples), t0, t1, jobs)


def annotate(
    rows: Iterable[Any],
    cpu: CpuSampler,
    waits: str = "round trips / locks",
    scenarios: tuple[str, ...] = ("drain", "drain_2p"),
) -> None:
    """Add the CPU figures and the verdict to every drain row that carries its window
    (``extra["window_start"]``, ``extra["window_end"]``, epoch seconds)."""
    server = cpu.server.name if cpu.server is not None and cpu.server.root is not None else ""
    for row in rows:
        if row.scenario not in scenarios or row.na or not row.jobs:
            continue
        t0, t1 = row.extra.get("window_start"), row.extra.get("window_end")
        if t0 is None or t1 is None:
            continue
        text, extra = describe(cpu.window(float(t0), float(t1), row.jobs), server, waits)
        row.extra.update(extra)
        row.note = f"{row.note}; {text}" if row.note else text


def measured(server: Server | None, waits: str, run: Callable[..., Any], *args: Any) -> Any:
    """``run(*args)`` under a sampler; the drain rows it returns (a Row or a list of Rows)
    annotated. Positional, to go through ``guarded``."""
    with CpuSampler(server) as cpu:
        out = run(*args)
    annotate(out if isinstance(out, list) else [out], cpu, waits)
    return out
