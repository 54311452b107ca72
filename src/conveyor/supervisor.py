"""``--processes N``: run N worker processes under one parent that restarts crashed ones and
passes SIGTERM/SIGINT on, so a deployment manages one process while using every core."""

from __future__ import annotations

import ctypes
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

from .worker import EXIT_STUCK

log = logging.getLogger("conveyor.supervisor")


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the supervisor dies, so no worker is left orphaned."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


class Supervisor:
    """Runs ``processes`` copies of the worker command ``argv``, restarts any that exit (with
    backoff; among them a child that exits because all its slots were stuck), and passes
    SIGTERM/SIGINT on to them. ``conveyor worker --processes N`` uses it."""

    def __init__(
        self, argv: Sequence[str], processes: int, *, grace_period: float = 30.0,
        metrics_port: int | None = None, metrics_addr: str = "127.0.0.1",
    ) -> None:
        self.argv = list(argv)
        self.metrics_port = metrics_port
        self.metrics_addr = metrics_addr
        self.processes = processes
        self.grace_period = grace_period
        self.children: dict[int, subprocess.Popen[bytes]] = {}
        self.stopping = False
        self.signals = 0

    def _spawn(self, slot: int) -> None:
        # Own process group: a terminal's Ctrl-C reaches only this parent, which passes it
        # on once (children count a second signal as "hurry up").
        argv = list(self.argv)
        if self.metrics_port is not None:
            # One port per slot, stable across restarts, so scrape targets stay put.
            argv += ["--metrics-port", str(self.metrics_port + slot),
                     "--metrics-addr", self.metrics_addr]
        child = subprocess.Popen(argv, process_group=0, preexec_fn=_die_with_parent)
        self.children[slot] = child
        log.info("started worker process %d (pid %d)", slot, child.pid)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.signals += 1
        self.stopping = True
        # A second signal is passed on too: children read it as "hurry up".
        for child in self.children.values():
            if child.poll() is None:
                child.send_signal(signum)

    def run(self) -> int:
        """Start the children and supervise them until a signal, then wait for them (up to
        the grace period plus 5 s, then SIGKILL) and return the exit code, 0."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        for slot in range(self.processes):
            self._spawn(slot)
        restarts: dict[int, float] = {}
        backoff: dict[int, float] = {}
        while not self.stopping:
            time.sleep(0.2)
            for slot, child in list(self.children.items()):
                code = child.poll()
                if code is None or self.stopping:
                    continue
                delay = backoff.get(slot, 0.5)
                if slot not in restarts:
                    # A child whose slots were all stuck on hung sync tasks exits on its own
                    # (Worker.stuck_grace): a fresh process is the only way to free them.
                    why = " (every slot stuck)" if code == EXIT_STUCK else ""
                    log.error("worker process %d (pid %d) exited with %s%s; restarting in %.1fs",
                              slot, child.pid, code, why, delay)
                    restarts[slot] = time.monotonic() + delay
                    backoff[slot] = min(delay * 2, 30.0)
                if time.monotonic() >= restarts[slot]:
                    del restarts[slot]
                    self._spawn(slot)
                    if code == 0:
                        backoff.pop(slot, None)
        deadline = time.monotonic() + self.grace_period + 5
        for child in self.children.values():
            left = max(0.0, deadline - time.monotonic())
            try:
                child.wait(timeout=left)
            except subprocess.TimeoutExpired:
                log.error("worker pid %d did not stop in time; killing it", child.pid)
                child.kill()
                child.wait()
        return 0
