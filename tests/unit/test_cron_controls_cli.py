"""`conveyor cron disable|enable|run NAME` and the controls in `conveyor cron list`."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from conveyor import Conveyor
from conveyor.backends.base import ErrorInfo, Lease
from conveyor.cli import cli
from conveyor.cron import Scheduler

APP = '''
from conveyor import Conveyor

app = Conveyor()

@app.cron("*/15 * * * *", name="cleanup", kwargs={"days": 7})
def cleanup(days: int) -> None: ...
'''


@pytest.fixture
def app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = f"croncontrols_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("CONVEYOR_URL", f"sqlite:///{tmp_path}/c.db")
    made = CliRunner().invoke(cli, ["--app", f"{name}:app", "migrate"])
    assert made.exit_code == 0, made.output
    yield f"{name}:app"
    sys.modules.pop(name, None)


def _run(app_module: str, *args: str) -> Any:
    return CliRunner().invoke(cli, ["--app", app_module, "cron", *args], env={"COLUMNS": "200"})


def _app(app_module: str) -> Conveyor:
    module = sys.modules[app_module.partition(":")[0]]
    app: Conveyor = module.app
    return app


def _rows(app_module: str) -> dict[str, Any]:
    out = _run(app_module, "list", "--json")
    assert out.exit_code == 0, out.output
    return {r["name"]: r for r in json.loads(out.output)}


def test_disable_and_enable_are_stored_and_shown(app_module: str) -> None:
    assert _rows(app_module)["cleanup"]["enabled"] is True
    out = _run(app_module, "disable", "cleanup")
    assert out.exit_code == 0, out.output
    assert "cleanup is disabled" in out.output
    app = _app(app_module)
    assert app.backend.cron_states()["cleanup"].disabled
    row = _rows(app_module)["cleanup"]
    assert row["enabled"] is False and row["disabled_at"] is not None
    assert "disabled" in _run(app_module, "list").output
    again = _run(app_module, "disable", "cleanup")
    assert again.exit_code == 0 and "already disabled" in again.output

    out = _run(app_module, "enable", "cleanup")
    assert out.exit_code == 0 and "cleanup is enabled" in out.output
    assert not app.backend.cron_states()["cleanup"].disabled
    assert _rows(app_module)["cleanup"]["enabled"] is True
    assert "already enabled" in _run(app_module, "enable", "cleanup").output


def test_unknown_schedules_are_refused(app_module: str) -> None:
    for command in ("disable", "enable", "run"):
        out = _run(app_module, command, "nope")
        assert out.exit_code != 0
        assert "no cron schedule named 'nope'" in out.output
    assert "nope" not in _app(app_module).backend.cron_states()


def test_run_enqueues_a_manual_run_and_keeps_the_tick(app_module: str) -> None:
    out = _run(app_module, "run", "cleanup")
    assert out.exit_code == 0, out.output
    app = _app(app_module)
    [job] = app.backend.list_jobs(limit=10).jobs
    assert f"enqueued job {job.id}" in out.output
    assert job.meta["cron"]["manual"] is True and job.args == {"days": 7}
    assert app.backend.cron_ticks() == {}  # the schedule did not move


def test_list_shows_the_last_runs_outcome_and_job(app_module: str) -> None:
    out = _run(app_module, "list", "--json")  # import the app module
    assert json.loads(out.output)[0]["last_run"] is None
    app = _app(app_module)
    scheduler = Scheduler(app)
    scheduler.run_pending(now=1_767_225_600.0 + 60)  # 2026-01-01 00:01 UTC: first sight
    [made] = scheduler.run_pending(now=1_767_225_600.0 + 15 * 60 + 1)
    [job] = app.backend.claim(made_queue(app), 1, worker_id="w", lease_s=30)
    assert job.lease_token is not None
    app.backend.kill(Lease(job.id, job.lease_token),
                     ErrorInfo("exception", "disk full", "OSError", "Traceback ..."))
    row = _rows(app_module)["cleanup"]
    last = row["last_run"]
    assert last["job_id"] == made.id and last["state"] == "dead"
    assert last["error"] == "OSError: disk full" and last["finished_at"] is not None
    table = _run(app_module, "list").output
    assert f"#{made.id}" in table and "dead" in table


def made_queue(app: Conveyor) -> str:
    return app.schedules["cleanup"].queue
