"""The CLI shows workflows (issue 35): `jobs list --state waiting`, `jobs show` with parents,
batch and callback, `stats` with waiting jobs, `batches show`. On SQLite."""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner

from conveyor import Conveyor
from conveyor.cli import cli

WIDE = {"COLUMNS": "250"}


def run(url: str, *args: str) -> str:
    result = CliRunner().invoke(cli, ["--url", url, *args], env=WIDE)
    assert result.exit_code == 0, result.output
    return result.output


def row(output: str, key: str) -> str:
    """The value of ``key``'s row in a two-column table."""
    m = re.search(rf"^ *{key} +(\S.*?) *$", output, re.M)
    assert m, f"no row {key!r} in:\n{output}"
    return m.group(1)


def make(tmp_path: Path) -> tuple[str, Conveyor]:
    url = f"sqlite:///{tmp_path}/c.db"
    return url, Conveyor(url)


def test_waiting_jobs_are_listed_counted_and_show_their_workflow(tmp_path: Path) -> None:
    url, app = make(tmp_path)

    @app.task(name="member")
    def member(n: int) -> int:
        return n

    @app.task(name="report")
    def report() -> None:
        return None

    try:
        parent = member.enqueue(0)
        child = member.options(after=[parent], on_parent_failure="run").enqueue(1)
        with app.batch(on_success=report.s()) as b:
            member.enqueue(2)
        callback = b.on_success_job
        assert callback is not None
    finally:
        app.close()

    listed = json.loads(run(url, "jobs", "list", "--state", "waiting", "--json"))
    assert sorted(j["id"] for j in listed) == sorted([child.id, callback.id])
    assert "waiting" in run(url, "jobs", "list", "--state", "waiting")

    shown = run(url, "jobs", "show", str(child.id))
    assert row(shown, "parents") == str(parent.id)
    assert row(shown, "on parent failure") == "run"
    member_shown = run(url, "jobs", "show", str(b.jobs[0].id))
    assert row(member_shown, "batch") == b.id
    cb_shown = run(url, "jobs", "show", str(callback.id))
    assert row(cb_shown, "callback of") == b.id
    assert "parents" not in run(url, "jobs", "show", str(parent.id))
    as_json = json.loads(run(url, "jobs", "show", str(child.id), "--json"))
    assert as_json["parents"] == [parent.id]

    stats = run(url, "stats")
    assert "waiting" in stats
    stats_json = json.loads(run(url, "stats", "--json"))
    [q] = stats_json["queues"]
    assert q["waiting"] == 2

    batch = run(url, "batches", "show", b.id)
    assert row(batch, "id") == b.id and row(batch, "total") == "1"
    assert row(batch, "on success") == str(callback.id)
    assert row(batch, "on complete") == "-"
    batch_json = json.loads(run(url, "batches", "show", b.id, "--json"))
    assert (batch_json["total"], batch_json["pending"], batch_json["on_success"]) == (
        1, 1, callback.id)


def test_an_unknown_batch_is_an_error(tmp_path: Path) -> None:
    url, app = make(tmp_path)
    app.backend  # noqa: B018 - creates the store
    app.close()
    result = CliRunner().invoke(cli, ["--url", url, "batches", "show", "nope"])
    assert result.exit_code != 0
    assert "no batch" in result.output
