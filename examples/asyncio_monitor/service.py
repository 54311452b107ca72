"""An asyncio-only service: one event loop queues a TCP probe per target every few seconds
and runs them as ``async def`` jobs with a Conveyor worker of its own. No threads of yours,
no web framework; the jobs outlive a restart of the service in an SQLite file.

From the ``examples/`` directory::

    python -m asyncio_monitor 127.0.0.1:5432 127.0.0.1:6379 --interval 10
    conveyor --app asyncio_monitor.service:app jobs list --state succeeded   # the probes' results

SIGTERM or Ctrl-C stops it: no new probes are queued, running ones finish (or are handed
back to the queue after the grace period), then it exits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Sequence
from typing import Any

from conveyor import Conveyor
from conveyor.worker import Worker

log = logging.getLogger("asyncio_monitor")

app = Conveyor(os.environ.get("CONVEYOR_URL", "sqlite:///monitor.db"), visibility_timeout=15)


# An explicit name: stored jobs refer to tasks by name, and the default (module.function)
# would change if this module moved or ran as __main__.
@app.task(name="monitor.probe", queue="probes", max_attempts=3, timeout=10)
async def probe(host: str, port: int) -> dict[str, Any]:
    """Open a TCP connection to ``host:port`` and report whether it answered, and how fast.

    An ``async def`` task runs on the worker's event loop: thousands of slow probes cost no
    threads. A target that is down is a result (``up: false``), not a failure to retry.
    """
    started = time.perf_counter()
    try:
        async with asyncio.timeout(3):
            _reader, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError) as exc:
        log.warning("%s:%d is down: %s", host, port, exc or type(exc).__name__)
        return {"target": f"{host}:{port}", "up": False, "error": str(exc) or type(exc).__name__}
    writer.close()
    await writer.wait_closed()
    return {"target": f"{host}:{port}", "up": True, "ms": round((time.perf_counter() - started) * 1000, 3)}


class Monitor:
    """Queues a probe of every target each ``interval`` seconds and runs a worker for them,
    both on the running event loop."""

    def __init__(self, targets: Sequence[tuple[str, int]], *, interval: float = 30.0, concurrency: int = 50) -> None:
        self.targets = list(targets)
        self.interval = interval
        self.worker = Worker(app, queues="probes", concurrency=concurrency, grace_period=5,
                             install_signal_handlers=False)
        self._stop = asyncio.Event()
        self.last_probe: dict[tuple[str, int], int] = {}  # target -> id of its latest probe job
        self.queued = 0  # probe jobs this monitor added

    async def schedule(self) -> None:
        while not self._stop.is_set():
            for target in self.targets:
                host, port = target
                try:
                    # While this target's last probe is still waiting or running, the unique
                    # key hands back that job instead of adding another: a slow or stuck
                    # target never piles up probes.
                    job = await probe.options(unique_key=f"probe:{host}:{port}").aenqueue(host, port)
                except Exception:
                    log.exception("could not queue a probe of %s:%d; trying again next round", host, port)
                    continue
                if self.last_probe.get(target) != job.id:
                    self.last_probe[target] = job.id
                    self.queued += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.interval)

    async def run(self) -> None:
        """Run until ``stop()``; then stop queueing, let the worker finish, and return."""
        scheduler = asyncio.create_task(self.schedule(), name="monitor-schedule")
        try:
            await self.worker.run_async()
        finally:
            self._stop.set()
            await scheduler

    def stop(self) -> None:
        self._stop.set()
        self.worker.stop()


def parse_target(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m asyncio_monitor", description="Probe TCP targets.")
    parser.add_argument("targets", nargs="+", type=parse_target, metavar="HOST:PORT")
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between probes of a target")
    args = parser.parse_args(argv)
    monitor = Monitor(args.targets, interval=args.interval)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, monitor.stop)
    await monitor.run()
