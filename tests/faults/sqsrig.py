"""moto's SQS server for the fault tests: a process of its own on a loopback port, which a test
can SIGKILL (a crash) and start again on the same port, so every URL stays valid.

moto keeps everything in memory: a restarted server has no queues and no messages. (moto's
"recorder" replays recorded requests into a server; that is not persistence: the replayed
receives and deletes act on a different state.) So a restart here shows how Conveyor's
processes come back after one, not that the server kept anything (test_sqs_faults.py).

Started and stopped as the broker suites start theirs (brokerstores.start_moto, stop_moto); the
server is only ever ended by its pid, by the test that started it.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from brokerstores import free_port, start_moto, stop_moto


class MotoServer:
    """``python -m moto.server`` on ``127.0.0.1:port``; output in ``log_dir``."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> MotoServer:
        self.starts += 1
        self.proc = start_moto(self.port, self.log_dir / f"moto_server.{self.starts}.log")
        return self

    def kill(self) -> None:
        """SIGKILL, as a crash: whatever it held in memory is gone."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None:
            stop_moto(self.proc)
