"""The examples of docs/testing.md ("Testing your tasks") pass as printed: the pytest one with
``pytest`` (the plugin found through its entry point) on SQLite, PostgreSQL and Redis, the
unittest one with ``python -m unittest``, each in a process of its own, in the example's
directory, as a user would run them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from stores import POSTGRES_URL, REDIS_URL

SHOP = Path(__file__).resolve().parents[2] / "examples" / "testing_shop"


def run(*args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CONVEYOR_", "PYTEST_"))}
    # Production's store, which no test may touch: it cannot even be created.
    env["CONVEYOR_URL"] = "sqlite:////nonexistent/production.db"
    env.update(extra_env or {})
    return subprocess.run([sys.executable, *args], cwd=SHOP, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("store", ["sqlite", "postgres", "redis"])
def test_the_pytest_example_passes(store: str) -> None:
    extra = {"sqlite": {}, "postgres": {"CONVEYOR_TEST_URL": POSTGRES_URL},
             "redis": {"CONVEYOR_TEST_URL": REDIS_URL}}[store]
    result = run("-m", "pytest", "-p", "no:cacheprovider", "tests/test_with_pytest.py",
                 extra_env=extra)
    if store != "sqlite" and "could not connect" in result.stdout.lower():
        if os.environ.get("CI") == "true":  # a missing server never turns CI green
            pytest.fail(f"{store} unavailable", pytrace=False)
        pytest.skip(f"{store} unavailable")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed" in result.stdout


def test_the_unittest_example_passes() -> None:
    result = run("-m", "unittest", "-v", "tests/test_with_unittest.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Ran 2 tests" in result.stderr and "OK" in result.stderr
