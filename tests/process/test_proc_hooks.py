"""``process_init`` runs once in every worker process, the children of ``--processes N`` too."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from processrig import session_members, wait_until

APP = textwrap.dedent("""
    import os
    from conveyor import Conveyor

    app = Conveyor()

    @app.on("process_init")
    def opened(event):
        with open(os.environ["INIT_MARKER"], "a") as f:
            f.write(f"{os.getpid()}\\n")

    @app.task
    def noop():
        pass
""")


def test_process_init_runs_in_each_child_of_a_supervisor(tmp_path: Path) -> None:
    (tmp_path / "hookapp.py").write_text(APP)
    marker = tmp_path / "init.txt"
    env = {**os.environ, "CONVEYOR_URL": f"sqlite:///{tmp_path}/jobs.db",
           "INIT_MARKER": str(marker), "PYTHONPATH": str(tmp_path)}
    env.pop("CONVEYOR_APP", None)
    with open(tmp_path / "err.txt", "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "conveyor", "--app", "hookapp:app", "worker",
             "--processes", "2", "--poll-interval", "0.2"],
            env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
            start_new_session=True)
    try:
        def pids() -> set[str]:
            return set(marker.read_text().split()) if marker.exists() else set()

        wait_until(lambda: len(pids()) == 2, 30,
                   lambda: f"two children's process_init\n{(tmp_path / 'err.txt').read_text()}")
        assert str(proc.pid) not in pids()  # the supervisor runs no jobs: no process_init
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert len(marker.read_text().split()) == 2  # once per process
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        for pid in session_members(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
