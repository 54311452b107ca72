"""`jobs show` prints the job's uid (the key to compare with what other systems recorded:
an id can name another job after a store lost data), and `--json` carries it."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from conveyor.backends import open_backend
from conveyor.backends.base import NewJob
from conveyor.cli import cli


def test_jobs_show_prints_the_uid(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/c.db"
    b = open_backend(url)
    try:
        [made] = b.enqueue_many([NewJob(task="t.x", queue="q", args="{}", max_attempts=1, timeout=30)])
    finally:
        b.close()
    assert made.uid is not None
    shown = CliRunner().invoke(cli, ["--url", url, "jobs", "show", str(made.id)], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert made.uid in shown.output
    as_json = CliRunner().invoke(cli, ["--url", url, "jobs", "show", str(made.id), "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.output)["uid"] == made.uid
