"""`make demo` installs Conveyor alone; `make test` (and every other target) the dev tools.
Dry runs (`make -n`) against a .venv path of the test's own, so nothing is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def dry_run(target: str, venv: Path) -> str:
    done = subprocess.run(["make", "-n", "-C", str(ROOT), target, f"VENV={venv}"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def installs(commands: str) -> list[str]:
    return [line.split("install --quiet ", 1)[1] for line in commands.splitlines()
            if "pip install --quiet -e" in line]


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    if shutil.which("make") is None:
        raise AssertionError("make is not installed: the README's two set-up commands need it")
    return tmp_path / ".venv"


def test_on_a_fresh_machine_demo_installs_conveyor_alone_and_test_the_dev_tools(venv: Path) -> None:
    assert installs(dry_run("demo", venv)) == ["-e ."]
    assert installs(dry_run("test", venv)) == ["-e '.[dev]'"]
    assert f"{venv}/bin/conveyor demo" in dry_run("demo", venv)


def test_after_the_demo_the_tests_still_get_the_dev_tools(venv: Path) -> None:
    # What `make demo` leaves: a venv, its stamp and the console script pip wrote, all newer
    # than pyproject.toml. The script's date must not pass for the dev install.
    (venv / "bin").mkdir(parents=True)
    later = (ROOT / "pyproject.toml").stat().st_mtime + 10
    for name in ("bin/python", "bin/conveyor", ".installed-demo"):
        (venv / name).write_text("")
        (venv / name).chmod(0o755)
        os.utime(venv / name, (later, later))
    assert installs(dry_run("demo", venv)) == []
    assert installs(dry_run("test", venv)) == ["-e '.[dev]'"]
    assert installs(dry_run("lint", venv)) == ["-e '.[dev]'"]
    (venv / ".installed-dev").write_text("")
    os.utime(venv / ".installed-dev", (later, later))
    os.utime(venv / "bin/conveyor", (later + 1, later + 1))
    assert installs(dry_run("test", venv)) == []


def test_test_fast_is_the_suite_without_the_fault_and_scale_tiers(venv: Path) -> None:
    assert installs(dry_run("test-fast", venv)) == ["-e '.[dev]'"]
    [fast] = [line for line in dry_run("test-fast", venv).splitlines() if "/bin/pytest" in line]
    assert fast.split()[1:] == ["--ignore=tests/faults", "--ignore=tests/scale"]
    [full] = [line for line in dry_run("test", venv).splitlines() if "/bin/pytest" in line]
    assert full.split()[1:] == []  # `make test` stays the whole suite
