"""``conveyor worker`` refuses bad options at once, with a message naming the option, and never
starts (or keeps restarting) workers with them, with or without ``--processes``."""

from __future__ import annotations

import pytest
from processrig import Rig

pytestmark = pytest.mark.process

BAD_OPTIONS = [
    pytest.param(["--concurrency", "0"], "concurrency", id="concurrency-0"),
    pytest.param(["--visibility-timeout", "-1"], "visibility", id="visibility-timeout-negative"),
    # 0 must not quietly mean "the app's default lease".
    pytest.param(["--visibility-timeout", "0"], "visibility", id="visibility-timeout-0"),
    # 0 makes an idle worker spin on write-locking claims (a whole core, and the store's lock).
    pytest.param(["--poll-interval", "0"], "poll", id="poll-interval-0"),
    pytest.param(["--grace", "-1"], "grace", id="grace-negative"),
    # 0 would give every held job back the moment it is held: prefetch that only churns.
    pytest.param(["--prefetch", "2", "--prefetch-hold", "0"], "prefetch-hold", id="prefetch-hold-0"),
    pytest.param(["--processes", "0"], "processes", id="processes-0"),
    pytest.param(["--queues", "bad!name"], "queue", id="bad-queue-name"),
    # Under a supervisor, a bad option must not become an endless restart loop of failing children.
    pytest.param(["--processes", "2", "--concurrency", "0"], "concurrency", id="supervised-concurrency-0"),
    pytest.param(["--processes", "2", "--queues", "bad!name"], "queue", id="supervised-bad-queue-name"),
]


@pytest.mark.parametrize(("options", "named"), BAD_OPTIONS)
def test_worker_refuses_bad_option(rig: Rig, options: list[str], named: str) -> None:
    args = ["worker", "--queues", "default", "--poll-interval", "0.2", *options]
    proc = rig.spawn(*args, name="W")

    def outcome() -> str | None:
        if proc.popen.poll() is not None:
            return "exited"
        if proc.started_workers():
            return "started a worker"
        if "restarting" in proc.stderr():
            return "restarting failed children"
        return None

    what = rig.wait_until(outcome, 20, "the worker to exit or start")
    assert what == "exited", f"conveyor {' '.join(args)} {what} instead of refusing:\n{proc.stderr()}"
    assert proc.popen.returncode not in (0, None)
    assert named in proc.stderr().lower(), proc.stderr()
    assert "Traceback" not in proc.stderr()
