"""What a new user meets first on the command line: where --app goes, which SQLite file is
used, a task module that fails to import, piped output, and the dead-letter commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result
from support import running_worker, wait_for_job

from conveyor import Conveyor
from conveyor.cli import cli

LONG_TASK = "reports.quarterly_revenue_by_region_and_product_line_reconciled_against_the_ledger_v2"
LONG_ERROR = "upstream ledger service answered 503 " + "while reconciling region emea-north " * 4

APP = f'''
from conveyor import Conveyor, Reject

app = Conveyor("sqlite:///fr.db")

@app.task(queue="default", max_attempts=1)
def add(a: int, b: int) -> int:
    return a + b

@app.task(name="{LONG_TASK}", max_attempts=1)
def reconcile() -> None:
    raise Reject("{LONG_ERROR}")
'''


class Project:
    def __init__(self, root: Path, module: str) -> None:
        self.root = root
        self.module = module
        self.spec = f"{module}:app"
        self.db = root / "fr.db"

    @property
    def app(self) -> Conveyor:
        app = sys.modules[self.module].app
        assert isinstance(app, Conveyor)
        return app

    def invoke(self, *argv: str) -> Result:
        return CliRunner().invoke(cli, list(argv))


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Project]:
    """A project directory with a task module, as the working directory; no $CONVEYOR_*."""
    module = f"frapp_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(APP)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for var in ("CONVEYOR_URL", "CONVEYOR_APP", "COLUMNS"):
        monkeypatch.delenv(var, raising=False)
    __import__(module)
    p = Project(tmp_path, module)
    try:
        yield p
    finally:
        p.app.close()
        sys.modules.pop(module, None)


# -- --app, --url, --verbose before or after the subcommand ---------------------------------
@pytest.mark.parametrize("argv", [
    ["stats", "--json"],
    ["jobs", "list", "--json"],
    ["jobs", "show", "1", "--json"],
    ["dlq", "list", "--json"],
    ["cron", "list", "--json"],
    ["alerts", "--once", "--allow-no-workers"],
    ["migrate"],
])
def test_app_option_works_before_and_after_the_subcommand(project: Project, argv: list[str]) -> None:
    project.app.get_task(f"{project.module}.add").enqueue(1, 2)
    before = project.invoke("--app", project.spec, *argv)
    after = project.invoke(*argv, "--app", project.spec)
    assert before.exit_code == 0, before.output
    assert after.exit_code == 0, after.output
    if "--json" in argv and argv[0] != "stats":  # stats carries the time it was taken
        assert json.loads(after.stdout) == json.loads(before.stdout)


def test_every_command_but_the_demo_takes_app_and_url_after_it() -> None:
    def walk(group: click.Group) -> Iterator[click.Command]:
        for command in group.commands.values():
            yield command
            if isinstance(command, click.Group):
                yield from walk(command)

    commands = list(walk(cli))
    assert len(commands) > 15
    for command in commands:
        names = {o for p in command.params for o in p.opts}
        assert {"--log-level", "--log-format", "--verbose"} <= names, command.name
        assert ({"--app", "--url"} <= names) == (command.name != "demo"), command.name


def test_enqueue_takes_app_and_url_after_the_subcommand(project: Project, tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    result = project.invoke("enqueue", f"{project.module}.add", "--args", "[1, 2]", "--json",
                            "--app", project.spec, "--url", f"sqlite:///{other}")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["args"] == {"a": 1, "b": 2}
    assert other.exists()
    listed = project.invoke("jobs", "list", "--json", "--url", f"sqlite:///{other}")
    assert [j["task"] for j in json.loads(listed.stdout)] == [f"{project.module}.add"]


@pytest.mark.parametrize("argv", [["worker"], ["enqueue", "x.add"], ["cron", "list"]])
def test_commands_that_need_the_tasks_say_so_when_no_app_is_given(project: Project, argv: list[str]) -> None:
    result = project.invoke(*argv)
    assert result.exit_code == 2
    assert "needs --app module:attribute" in result.output


def test_worker_takes_app_after_the_subcommand_and_shows_the_absolute_store_path(project: Project) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env["PYTHONPATH"] = str(project.root)
    proc = subprocess.Popen([sys.executable, "-m", "conveyor", "worker", "--app", project.spec, "-c", "1"],
                            cwd=project.root, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        created = proc.stderr.readline()
        banner = proc.stderr.readline()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert created == f"conveyor: created a new empty store at {project.db}\n"
    assert banner.startswith("conveyor worker "), banner
    assert f"on sqlite:///{project.db}:" in banner


# -- which SQLite file ---------------------------------------------------------------------
def test_a_relative_sqlite_url_is_made_absolute_when_the_app_is_created(project: Project) -> None:
    assert project.app.url == f"sqlite:///{project.db}"
    assert Conveyor("sqlite:///x.db?synchronous=full").url == f"sqlite:///{project.root}/x.db?synchronous=full"
    absolute = f"sqlite:///{project.root}/elsewhere/y.db"
    assert Conveyor(absolute).url == absolute


@pytest.mark.parametrize("argv", [["stats"], ["jobs", "list"], ["dlq", "list"], ["jobs", "show", "1"],
                                  ["dlq", "purge", "--yes"]])
def test_read_commands_do_not_create_a_store_and_say_where_they_looked(project: Project,
                                                                       argv: list[str]) -> None:
    result = project.invoke(*argv)  # no --app: the default sqlite:///conveyor.db, here
    assert result.exit_code == 1, result.output
    assert f"no store at {project.root / 'conveyor.db'}" in result.stderr
    assert not (project.root / "conveyor.db").exists()
    assert not project.db.exists()


def test_a_command_that_creates_a_new_store_says_where(project: Project) -> None:
    result = project.invoke("enqueue", f"{project.module}.add", "--args", "[1, 2]", "--app", project.spec)
    assert result.exit_code == 0, result.output
    assert f"created a new empty store at {project.db}" in result.stderr
    again = project.invoke("enqueue", f"{project.module}.add", "--args", "[1, 2]", "--app", project.spec)
    assert again.exit_code == 0 and "created" not in again.stderr


# -- a task module that fails at import ------------------------------------------------------
BROKEN = {
    "KeyError": ("import os\n\nSETTING = os.environ['CONVEYOR_TEST_UNSET_SETTING']\n", 3,
                 "KeyError: 'CONVEYOR_TEST_UNSET_SETTING'"),
    "NameError": ("from conveyor import Conveyor\napp = Conveyor()\nundefined_helper()\n", 3,
                  "NameError: name 'undefined_helper' is not defined"),
    "SyntaxError": ("from conveyor import Conveyor\n\ndef broken(:\n    pass\n", 3, "SyntaxError: "),
}


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_an_import_error_in_the_task_module_is_one_line_with_file_and_line(project: Project, kind: str) -> None:
    source, line, what = BROKEN[kind]
    module = f"broken_{kind.lower()}_{project.module}"
    (project.root / f"{module}.py").write_text(source)
    result = project.invoke("stats", "--app", f"{module}:app")
    assert result.exit_code == 1
    [message] = result.stderr.strip().splitlines()
    assert message.startswith(f"error: cannot import {module}: {what}")
    assert f"({module}.py:{line})" in message and "--verbose" in message
    assert "Traceback" not in result.output

    for argv in (["--verbose", "stats", "--app", f"{module}:app"], ["stats", "--app", f"{module}:app", "--verbose"]):
        verbose = project.invoke(*argv)
        assert verbose.exit_code == 1
        assert f"{module}.py" in verbose.stderr and ("Traceback" in verbose.stderr or kind == "SyntaxError")
        assert len(verbose.stderr.splitlines()) > 2
    sys.modules.pop(module, None)


def test_a_missing_module_is_one_line(project: Project) -> None:
    result = project.invoke("stats", "--app", "no_such_module_here:app")
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "error: cannot import no_such_module_here: ModuleNotFoundError: No module named 'no_such_module_here'"
        "; --verbose for the traceback"]


# -- piped output ----------------------------------------------------------------------------
def _dead_reconcile(project: Project) -> int:
    job = project.app.get_task(LONG_TASK).enqueue()
    with running_worker(project.app, queues="default"):
        wait_for_job(project.app, job.id, "dead")
    return job.id


def test_piped_tables_and_errors_are_not_cut_at_80_columns(project: Project) -> None:
    job_id = _dead_reconcile(project)
    for argv in (["jobs", "list"], ["dlq", "list"]):
        result = project.invoke(*argv, "--app", project.spec)
        assert result.exit_code == 0, result.output
        assert any(LONG_TASK in line for line in result.stdout.splitlines()), result.stdout
    shown = project.invoke("dlq", "show", str(job_id), "--app", project.spec)
    assert shown.exit_code == 0, shown.output
    assert any(LONG_ERROR in line for line in shown.stdout.splitlines()), shown.stdout
    assert any(LONG_TASK in line for line in shown.stdout.splitlines())


# -- the dead-letter commands ------------------------------------------------------------------
def test_dlq_show_json_is_what_jobs_show_json_prints(project: Project) -> None:
    job_id = _dead_reconcile(project)
    dlq = project.invoke("dlq", "show", str(job_id), "--json", "--app", project.spec)
    jobs = project.invoke("jobs", "show", str(job_id), "--json", "--app", project.spec)
    assert dlq.exit_code == 0, dlq.output
    assert json.loads(dlq.stdout) == json.loads(jobs.stdout)
    assert json.loads(dlq.stdout)["state"] == "dead"
    assert json.loads(dlq.stdout)["errors"][0]["message"] == LONG_ERROR


def test_dlq_show_of_a_job_that_is_not_dead_says_so(project: Project) -> None:
    job = project.app.get_task(f"{project.module}.add").enqueue(1, 2)
    for argv in (["dlq", "show", str(job.id)], ["dlq", "show", str(job.id), "--json"]):
        result = project.invoke(*argv, "--app", project.spec)
        assert result.exit_code == 1
        assert f"job {job.id} is not in the dead-letter queue: it is available" in result.stderr
        assert result.stdout == ""


def test_dlq_purge_that_purges_nothing_says_why(project: Project) -> None:
    job = project.app.get_task(f"{project.module}.add").enqueue(1, 2)
    result = project.invoke("dlq", "purge", "--yes", "--app", project.spec)
    assert result.exit_code == 0, result.output
    assert "no dead jobs" in result.stdout
    ids = project.invoke("dlq", "purge", str(job.id), "--app", project.spec)
    assert "purged 0 dead job(s)" in ids.stdout
    assert "1 id(s) were not dead jobs and were left alone" in ids.stderr
    dead = _dead_reconcile(project)
    on_queue = project.invoke("dlq", "purge", "--yes", "--queue", "low", "--app", project.spec)
    assert "no dead jobs on queue low" in on_queue.stdout
    assert project.app.get_job(dead).state == "dead"
