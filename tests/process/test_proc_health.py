"""`conveyor health` against a real worker (docs/deployment.md): it passes while the worker
heartbeats, fails once the worker is frozen (SIGSTOP) past its lease or killed, passes again
when it resumes, and fails at once after a clean stop (the file is removed)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from processrig import Proc, Rig

pytestmark = pytest.mark.process

LEASE_S = 1.5  # heartbeats every 0.5 s


def health(rig: Rig, path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return rig.cli("health", "--heartbeat-file", str(path), *extra)


def beat_at(path: Path) -> float:
    try:
        return float(json.loads(path.read_text())["beat_at"])
    except (OSError, ValueError, KeyError):
        return 0.0


def start(rig: Rig, path: Path) -> Proc:
    w = rig.spawn("worker", "--concurrency", "2", "--visibility-timeout", str(LEASE_S),
                  "--poll-interval", "0.2", "--grace", "2", "--heartbeat-file", str(path),
                  name="W")
    rig.wait_started(w)
    return w


def test_health_follows_a_frozen_and_resumed_worker_and_a_clean_stop(rig: Rig) -> None:
    path = rig.tmp / "heartbeat"
    w = start(rig, path)

    ok = health(rig, path)
    assert ok.returncode == 0, ok.stdout + ok.stderr + rig.diagnosis()
    assert ok.stdout.startswith("ok: worker "), ok.stdout
    assert health(rig, path, "--store").returncode == 0  # SQLite takes every heartbeat
    # The heartbeat loop rewrites the file, not only the start.
    first = beat_at(path)
    rig.wait_until(lambda: beat_at(path) > first, 5 * LEASE_S, "a rewritten heartbeat file")

    w.send(signal.SIGSTOP)
    stopped_at = time.time()
    try:
        failed = rig.wait_until(lambda: (r := health(rig, path)).returncode == 1 and r,
                                10 * LEASE_S, "health to fail for the frozen worker")
        # Not before a whole lease without a heartbeat.
        assert time.time() - beat_at(path) > LEASE_S
        assert beat_at(path) <= stopped_at
        assert "frozen" in failed.stdout, failed.stdout
    finally:
        w.send(signal.SIGCONT)
    rig.wait_until(lambda: health(rig, path).returncode == 0, 10 * LEASE_S,
                   "health to pass again once the worker resumed")

    w.send(signal.SIGTERM)
    assert w.wait(30) == 0, rig.diagnosis()
    assert not path.exists()
    gone = health(rig, path)
    assert gone.returncode == 1 and "no heartbeat file" in gone.stdout, gone.stdout


def test_health_fails_after_the_worker_is_killed(rig: Rig) -> None:
    path = rig.tmp / "heartbeat"
    w = start(rig, path)
    assert health(rig, path).returncode == 0
    w.send(signal.SIGKILL)
    w.wait(10)
    killed_at = time.time()
    assert path.exists()  # nothing removed it: the check must tell by its age
    rig.wait_until(lambda: health(rig, path).returncode == 1, 10 * LEASE_S,
                   "health to fail for the killed worker")
    assert time.time() - killed_at < 10 * LEASE_S


def test_heartbeat_file_from_the_environment_and_refused_with_processes(rig: Rig) -> None:
    path = rig.tmp / "hb-env"
    rig.env["CONVEYOR_HEARTBEAT_FILE"] = str(path)
    refused = rig.cli("worker", "--processes", "2")
    assert refused.returncode == 2, refused.stderr
    assert "--heartbeat-file needs --processes 1" in refused.stderr
    w = rig.spawn("worker", "--visibility-timeout", str(LEASE_S), "--poll-interval", "0.2",
                  name="E")
    rig.wait_started(w)
    checked = rig.cli("health")  # the probe reads the same variable
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"(pid {w.pid})" in checked.stdout
