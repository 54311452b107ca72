"""moto's SQS server for the fault tests: a process of its own on a loopback port, which a test
can SIGKILL (a crash) and start again on the same port, so every URL stays valid.

moto keeps everything in memory: a restarted server has no queues and no messages. (moto's
"recorder" replays recorded requests into a server; that is not persistence: the replayed
receives and deletes act on a different state.) So a restart here shows how Conveyor's
processes come back after one, not that the server kept anything (test_sqs_faults.py).

The server is only ever ended by its pid, by the test that started it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from stores import BackendUnavailable

START_TIMEOUT = 30.0
# moto takes any credentials; these keep boto3 from looking for the machine's own (and from
# signing with them). The test process and its worker processes both get them.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "conveyor-test", "AWS_SECRET_ACCESS_KEY": "conveyor-test"}
UNSET = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SQS")


def aws_env(home: Path) -> dict[str, str]:
    """The AWS variables of a process that talks to the test's server (see UNSET too)."""
    return {**CREDENTIALS, "AWS_CONFIG_FILE": str(home / "no-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(home / "no-credentials")}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


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
        log_path = self.log_dir / f"moto_server.{self.starts}.log"
        with open(log_path, "wb") as log:
            try:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            except OSError as exc:
                raise BackendUnavailable(f"cannot start moto's server: {exc}") from exc
        deadline = time.monotonic() + START_TIMEOUT
        while not answers(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise BackendUnavailable(f"moto's server did not start on {self.endpoint} "
                                         f"(exit code {self.proc.poll()}): {tail}")
            time.sleep(0.05)
        return self

    def kill(self) -> None:
        """SIGKILL, as a crash: whatever it held in memory is gone."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
