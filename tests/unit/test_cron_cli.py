"""`conveyor cron list`: every schedule with its last tick taken and its next run."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from conveyor.cli import cli

APP = '''
from conveyor import Conveyor

app = Conveyor()

@app.cron("0 9 * * *", name="morning-report", timezone="Europe/Paris")
def report() -> None: ...

@app.task(name="cleanup")
def cleanup(days: int) -> None: ...

app.schedule(cleanup, "*/15 * * * *", kwargs={"days": 7})
'''


@pytest.fixture
def app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = f"cronapp_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("CONVEYOR_URL", f"sqlite:///{tmp_path}/c.db")
    yield f"{name}:app"
    sys.modules.pop(name, None)


def test_cron_list_shows_schedules_last_and_next(app_module: str) -> None:
    runner = CliRunner()
    first = runner.invoke(cli, ["--app", app_module, "cron", "list", "--json"])
    assert first.exit_code == 0, first.output
    rows = {r["name"]: r for r in json.loads(first.output)}
    assert set(rows) == {"morning-report", "cleanup"}
    morning = rows["morning-report"]
    assert (morning["expression"], morning["timezone"]) == ("0 9 * * *", "Europe/Paris")
    assert morning["task"].endswith(".report") and rows["cleanup"]["task"] == "cleanup"
    assert morning["last_tick"] is None and morning["next_run"].endswith(("+01:00", "+02:00"))
    assert morning["next_run"][11:19] == "09:00:00"
    assert rows["cleanup"]["next_run"][14:16] in ("00", "15", "30", "45")

    table = runner.invoke(cli, ["--app", app_module, "cron", "list"], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "morning-report" in table.output and "Europe/Paris" in table.output
