"""Machine stalls, measured beside a latency check, so a latency bound judges Conveyor and not
the host it happens to share.

This machine is a virtual one whose hypervisor now and then takes a CPU away for tens or
hundreds of milliseconds (steal time). A task woken on that CPU waits it out, and a job
enqueued meanwhile waits too: one such stall in a 75 s soak is enough to push its claim-latency
p99 over the bound, however the queue behaves.

``StallMonitor`` runs one canary process pinned to each CPU, at real-time priority
(``SCHED_FIFO``): it sleeps PERIOD_S and notes when it woke more than STALL_S late. A
real-time task preempts every ordinary one, so the test's own processes (workers, the store,
the producer) cannot make it late however busy they are: only what the guest kernel does not
control can -- the hypervisor, or interrupts. Each late wake is a stall window
``[sleep start, woke]`` on that CPU.

Without the privilege to set ``SCHED_FIFO`` (not root), a canary would measure the test's own
load too, so none is started: ``available`` is False, no window is ever reported, and a check
using it excludes nothing (it says so).
"""

from __future__ import annotations

import bisect
import itertools
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field

PERIOD_S = 0.002  # each canary's sleep
STALL_S = 0.005  # woke this much late or more: a stall (the tightest latency bound is 20 ms)

_CANARY = r"""
import ctypes, os, signal, sys, time
cpu, period, stall, parent = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
# A real-time process must not outlive the test that started it (killed by a timeout, say).
ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
if os.getppid() != parent:
    sys.exit(0)
os.sched_setaffinity(0, {cpu})
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
except OSError as exc:
    print(f"no {exc}", flush=True)
    sys.exit(0)
print("ready", flush=True)
while True:
    t = time.time()
    time.sleep(period)
    late = time.time() - t - period
    if late >= stall:
        print(f"{t:.6f} {t + period + late:.6f}", flush=True)
"""


@dataclass
class Stall:
    cpu: int
    start: float  # time.time(): the canary went to sleep (the CPU was lost at some point after)
    end: float  # it woke

    @property
    def ms(self) -> float:
        return 1000 * (self.end - self.start - PERIOD_S)


@dataclass
class StallMonitor:
    stalls: list[Stall] = field(default_factory=list)
    available: bool = False
    why_not: str = ""
    _procs: list[subprocess.Popen[str]] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)
    _starts: list[float] = field(default_factory=list)  # overlaps(): stall starts, in order...
    _ends_upto: list[float] = field(default_factory=list)  # ...and the latest end up to each

    def start(self) -> StallMonitor:
        for cpu in sorted(os.sched_getaffinity(0)):
            p = subprocess.Popen([sys.executable, "-c", _CANARY, str(cpu), str(PERIOD_S), str(STALL_S), str(os.getpid())],
                                 stdout=subprocess.PIPE, text=True)
            self._procs.append(p)
            assert p.stdout is not None
            first = p.stdout.readline().strip()
            if first != "ready":
                self.why_not = f"no real-time canary on CPU {cpu}: {first or 'it exited'}"
                self.stop()
                return self
            t = threading.Thread(target=self._read, args=(cpu, p), name=f"stall-canary-{cpu}", daemon=True)
            t.start()
            self._threads.append(t)
        self.available = bool(self._procs)
        return self

    def _read(self, cpu: int, p: subprocess.Popen[str]) -> None:
        assert p.stdout is not None
        for line in p.stdout:
            a, b = line.split()
            self.stalls.append(Stall(cpu, float(a), float(b)))

    def stop(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            if p.stdout is not None:
                p.stdout.close()
        for t in self._threads:
            t.join(5)
        self._procs, self._threads = [], []

    def __enter__(self) -> StallMonitor:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def overlaps(self, a: float, b: float, *, after: float) -> bool:
        """Whether [a, b] meets a stall, each stall stretched by ``after`` s past its end (the
        time the work that piled up during it takes to catch up). A bisection, not a scan: a
        two-hour soak asks for each of ~700,000 jobs, and a busy host stalls thousands of times."""
        if len(self._ends_upto) != len(self.stalls):
            ordered = sorted(self.stalls, key=lambda s: s.start)
            self._starts = [s.start for s in ordered]
            self._ends_upto = list(itertools.accumulate((s.end for s in ordered), max))
        n = bisect.bisect_right(self._starts, b)  # the stalls that began by b
        return n > 0 and self._ends_upto[n - 1] + after >= a

    def summary(self) -> dict[str, object]:
        if not self.available:
            return {"stall_monitor": f"off ({self.why_not})"}
        ms = sorted(s.ms for s in self.stalls)
        return {"stalls": len(ms), "stall_ms_total": round(sum(ms), 1), "stall_ms_max": round(ms[-1], 1) if ms else 0.0,
                "stalls_per_cpu": {c: sum(1 for s in self.stalls if s.cpu == c) for c in sorted({s.cpu for s in self.stalls})}}


def hog(cpu: int, seconds: float) -> subprocess.Popen[str]:
    """A synthetic stall for testing the monitor: a real-time busy loop pinned to ``cpu`` at a
    priority above the canaries', for ``seconds`` (what a hypervisor taking the CPU away does
    to the guest's tasks on it)."""
    code = (f"import os,time\nos.sched_setaffinity(0,{{{cpu}}})\n"
            f"os.sched_setscheduler(0,os.SCHED_FIFO,os.sched_param(2))\n"
            f"end=time.time()+{seconds}\nwhile time.time()<end: pass\n")
    return subprocess.Popen([sys.executable, "-c", code], text=True)
