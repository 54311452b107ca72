"""examples/asyncio_monitor: one event loop queues probes and runs them as async jobs."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from support import wait_until

from conveyor import Conveyor, JobState

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens here once the socket is closed


def test_the_monitor_probes_its_targets_on_one_event_loop(
    tmp_path: Path, load_example: Callable[..., ModuleType]
) -> None:
    service = load_example("asyncio_monitor.service", CONVEYOR_URL=f"sqlite:///{tmp_path}/monitor.db")
    app: Conveyor = service.app
    closed = _closed_port()

    async def scenario() -> tuple[int, object]:
        accepted = 0

        def on_connect(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            nonlocal accepted
            accepted += 1
            w.close()

        server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        monitor = service.Monitor([("127.0.0.1", port), ("127.0.0.1", closed)], interval=0.05)
        running = asyncio.create_task(monitor.run())

        def finished() -> list[object]:
            return app.backend.list_jobs(state=JobState.SUCCEEDED, limit=1000).jobs

        deadline = time.monotonic() + 20
        while len(await asyncio.to_thread(finished)) < 6:
            assert time.monotonic() < deadline, "the monitor did not finish 6 probes within 20s"
            assert not running.done(), running
            await asyncio.sleep(0.05)
        monitor.stop()
        await asyncio.wait_for(running, 15)  # graceful: running probes finish first
        server.close()
        await server.wait_closed()
        return accepted, monitor

    accepted, monitor = asyncio.run(scenario())

    done = app.backend.list_jobs(state=JobState.SUCCEEDED, limit=1000).jobs
    up = [j.result for j in done if j.args["port"] != closed]
    down = [j.result for j in done if j.args["port"] == closed]
    assert up and all(r["up"] is True and r["ms"] >= 0 for r in up)
    assert down and all(r["up"] is False and r["error"] for r in down)
    assert accepted >= len(up)
    assert all(j.task == "monitor.probe" and j.attempts == 1 for j in done)
    # The unique key: never more than one unfinished probe per target, and nothing left running.
    unfinished = [j for j in app.backend.list_jobs(limit=1000).jobs if not j.is_final]
    assert all(j.state is not JobState.RUNNING for j in unfinished)
    assert len({j.unique_key for j in unfinished}) == len(unfinished) <= 2
    assert monitor.queued == len(app.backend.list_jobs(limit=1000).jobs)  # type: ignore[attr-defined]


def test_the_service_runs_as_a_program_and_stops_on_sigterm(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/monitor.db"
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    env = {**os.environ, "CONVEYOR_URL": url}
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncio_monitor", f"127.0.0.1:{port}", "--interval", "0.1"],
        cwd=EXAMPLES, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    app = Conveyor(url)
    try:
        wait_until(lambda: app.backend.list_jobs(state=JobState.SUCCEEDED, limit=10).jobs, timeout=30,
                   message="a probe succeeded")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        listener.close()
        app.close()
    assert proc.returncode == 0, out
    assert "stopped" in out  # the worker's shutdown line
