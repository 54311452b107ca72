"""examples/django: the shop project's own tests (``manage.py test shop``), run as a user
would, once on SQLite (Django's database and Conveyor's store) and once on PostgreSQL, where
an order and its job commit together through Django's own connection."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from conveyor.contrib.django.management.commands.conveyor import APP_SPEC, cli_args

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "django"
POSTGRES_URL = os.environ.get("CONVEYOR_TEST_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/test")


def manage_test(tmp_path: Path, **env: str) -> str:
    run = subprocess.run(
        [sys.executable, "manage.py", "test", "shop", "-v", "2", "--noinput"],
        cwd=EXAMPLE, capture_output=True, text=True, timeout=300,
        env={**os.environ, "SHOP_DATA_DIR": str(tmp_path), **env})
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    return output


def test_the_shop_on_sqlite(tmp_path: Path) -> None:
    output = manage_test(tmp_path, CONVEYOR_URL=f"sqlite:///{tmp_path}/jobs.db")
    assert "Ran 7 tests" in output and "OK (skipped=1)" in output
    assert "transactional enqueue needs PostgreSQL" in output  # the one PostgreSQL test


def test_the_shop_on_postgres_commits_orders_and_jobs_together(tmp_path: Path) -> None:
    psycopg = pytest.importorskip("psycopg")
    try:
        psycopg.connect(POSTGRES_URL, connect_timeout=3).close()
    except psycopg.OperationalError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL unavailable: {exc}")
        pytest.skip(f"PostgreSQL unavailable: {exc}")
    # Django creates (and drops) its own test database: a name of this run's alone.
    output = manage_test(tmp_path, SHOP_DATABASE=POSTGRES_URL,
                         SHOP_TEST_DATABASE=f"test_conveyor_django_{uuid.uuid4().hex[:10]}")
    assert "Ran 7 tests" in output and "skipped" not in output
    assert "test_an_order_and_its_job_commit_together_through_djangos_connection" in output


def test_manage_py_conveyor_passes_its_arguments_to_the_cli() -> None:
    assert cli_args(["worker", "-c", "4"]) == ["--app", APP_SPEC, "worker", "-c", "4"]
    # Django's own options were handled by manage.py already.
    assert cli_args(["--settings", "x.settings", "stats", "--pythonpath=."]) == [
        "--app", APP_SPEC, "stats"]
    assert cli_args(["--app", "mine:app", "worker"]) == ["--app", "mine:app", "worker"]
