"""A private RabbitMQ node for the fault tests (never the machine's shared one on 5672).

The node runs from a directory of the test's own: its name (``ct<random>@localhost``), AMQP
and distribution ports, Mnesia and log directories, an empty plugin list, no config file and
an Erlang cookie under ``HOME`` (which ``rabbitmqctl`` reads to reach it). It registers with
the machine's epmd, as every node does. ``kill()`` SIGKILLs its Erlang VM (the pid file's
pid) and the helper processes that VM started; ``start()`` again on the same directories
brings back what its quorum queues had made durable.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

from stores import BackendUnavailable

SBIN = Path("/usr/lib/rabbitmq/bin")
BOOT_S = 60.0  # a loaded 2-core machine boots a node in seconds; leave room


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_time(pid: int) -> str | None:
    """The start time of ``pid`` (field 22 of /proc/<pid>/stat): who a pid is, against reuse."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return raw[raw.rindex(")") + 2:].split()[19]


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        for k in map(int, kids):
            out.append(k)
            todo.append(k)
    return out


class RabbitNode:
    def __init__(self, tmp: Path) -> None:
        if not (SBIN / "rabbitmq-server").exists():
            raise BackendUnavailable(f"RabbitMQ is not installed ({SBIN}/rabbitmq-server)")
        self.dir = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "plugins").write_text("[].\n")
        (tmp / "env.conf").write_text("")
        self.node = f"ct{uuid.uuid4().hex[:10]}@localhost"
        self.port = free_port()
        self.env = {
            **os.environ, "HOME": str(tmp), "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_PORT": str(self.port), "RABBITMQ_DIST_PORT": str(free_port()),
            "RABBITMQ_MNESIA_BASE": str(tmp / "mnesia"), "RABBITMQ_LOG_BASE": str(tmp / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(tmp / "plugins"),
            "RABBITMQ_CONFIG_FILE": str(tmp / "none"), "RABBITMQ_PID_FILE": str(tmp / "pid"),
            "RABBITMQ_CONF_ENV_FILE": str(tmp / "env.conf"),
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def url(self, query: str = "") -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F" + (f"?{query}" if query else "")

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> RabbitNode:
        """Boot the node (again, on the same directories) and wait until AMQP answers."""
        import pika

        (self.dir / "pid").unlink(missing_ok=True)
        self.starts += 1
        with open(self.dir / f"server{self.starts}.out", "wb") as out:
            self.proc = subprocess.Popen([str(SBIN / "rabbitmq-server")], env=self.env,
                                         cwd=self.dir, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        params = pika.URLParameters(self.url("connection_attempts=1&socket_timeout=2"))
        deadline = time.monotonic() + BOOT_S
        while True:
            if self.proc.poll() is not None:
                raise BackendUnavailable(f"rabbitmq-server exited with {self.proc.returncode} "
                                         f"while booting: {self.tail()}")
            try:
                pika.BlockingConnection(params).close()
                return self
            except Exception as exc:  # still booting
                if time.monotonic() > deadline:
                    self.stop()
                    raise BackendUnavailable(f"the private RabbitMQ node did not answer on "
                                             f"{self.port} within {BOOT_S:g}s ({exc!r}): "
                                             f"{self.tail()}") from exc
                time.sleep(0.2)

    def beam_pid(self) -> int:
        return int((self.dir / "pid").read_text().strip())

    def kill(self) -> None:
        """SIGKILL the Erlang VM (a crash: nothing is flushed that was not already), and the
        helpers it started (erl_child_setup, inet_gethost: they exit with it, or are made to)."""
        assert self.proc is not None
        beam = self.beam_pid()
        helpers = [(p, _start_time(p)) for p in _descendants(beam)]
        os.kill(beam, signal.SIGKILL)
        self.proc.wait(15)  # the rabbitmq-server script, beam's parent, exits with it
        deadline = time.monotonic() + 5
        while (left := [(p, t) for p, t in helpers if t and _start_time(p) == t]) and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        for p, _ in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)

    def stop(self) -> None:
        """End the node if it runs (the teardown): a SIGKILL, as nothing of it is kept."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            self.kill()
            return
        # No pid file yet: the script and the VM it started share the process group made for
        # them (start_new_session).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(15)

    # -- faults and inspection ---------------------------------------------------------------
    def ctl(self, *args: str, timeout: float = 30.0) -> str:
        """``rabbitmqctl -n <node> ARGS`` against this node (it finds the cookie in HOME)."""
        done = subprocess.run([str(SBIN / "rabbitmqctl"), "-n", self.node, *args], env=self.env,
                              capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"rabbitmqctl {args}: {done.returncode}\n{done.stderr}"
        return done.stdout

    def close_all_connections(self, reason: str = "fault test") -> int:
        """Close every client connection (the broker sends connection.close); how many."""
        out = self.ctl("close_all_connections", reason)
        for line in out.splitlines():
            if line.startswith("Closed "):
                return int(line.split()[1])
        return 0

    def tail(self, lines: int = 20) -> str:
        text = "".join(p.read_text(errors="replace") for p in sorted(self.dir.glob("server*.out")))
        return "\n".join(text.splitlines()[-lines:])
