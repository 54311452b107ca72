"""Task discovery: ``Conveyor(include=[...])`` names the modules that define the app's tasks.

The worker and the commands that need the task registry (enqueue, cron list) import them; a
module that fails to import is the one-line error an --app module gives; the worker says which
tasks it loaded from which module when it starts."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from support import running_worker, wait_for_job

from conveyor import Conveyor, JobState
from conveyor.cli import cli
from conveyor.errors import ConfigurationError
from conveyor.worker import Worker


class Project:
    """A project directory: ``<p>app.py`` with ``include=[<p>mail, <p>billing]`` and those two
    task modules, importable and the working directory. Module names are unique per test."""

    def __init__(self, root: Path, prefix: str) -> None:
        self.root = root
        self.prefix = prefix
        self.app_module = f"{prefix}app"
        self.mail = f"{prefix}mail"
        self.billing = f"{prefix}billing"
        self.spec = f"{self.app_module}:app"

    def write(self, include: list[str] | None = None, *, extra: str = "") -> None:
        include = [self.mail, self.billing] if include is None else include
        (self.root / f"{self.app_module}.py").write_text(
            "from conveyor import Conveyor, RetryPolicy\n\n"
            f"app = Conveyor('sqlite:///{self.root}/inc.db', include={include!r},\n"
            "               retry=RetryPolicy(base=0.01, cap=0.02))\n" + extra)
        (self.root / f"{self.mail}.py").write_text(
            f"from {self.app_module} import app\n\n"
            "@app.task\n"
            "def send_welcome(user: str) -> str:\n"
            "    return f'welcome {user}'\n\n"
            "@app.task\n"
            "def send_digest() -> None:\n"
            "    pass\n")
        (self.root / f"{self.billing}.py").write_text(
            f"from {self.app_module} import app\n\n"
            "@app.cron('0 3 * * *', name='nightly-invoices')\n"
            "def invoice_all() -> int:\n"
            "    return 3\n")

    @property
    def app(self) -> Conveyor:
        app = sys.modules[self.app_module].app
        assert isinstance(app, Conveyor)
        return app

    def invoke(self, *argv: str) -> Result:
        return CliRunner().invoke(cli, list(argv))

    def forget(self) -> None:
        for name in [n for n in sys.modules if n.startswith(self.prefix)]:
            module = sys.modules.pop(name)
            app = getattr(module, "app", None)
            if isinstance(app, Conveyor):
                app.close()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Project]:
    prefix = f"inc_{tmp_path.name.replace('-', '_')}_"
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for var in ("CONVEYOR_URL", "CONVEYOR_APP", "COLUMNS"):
        monkeypatch.delenv(var, raising=False)
    p = Project(tmp_path, prefix)
    p.write()
    try:
        yield p
    finally:
        p.forget()


# -- the argument ------------------------------------------------------------------------------
def test_include_is_kept_as_a_tuple_of_module_names(tmp_path: Path) -> None:
    app = Conveyor(f"sqlite:///{tmp_path}/a.db", include=["myapp.tasks", "myapp.billing.tasks"])
    assert app.include == ("myapp.tasks", "myapp.billing.tasks")
    assert Conveyor(f"sqlite:///{tmp_path}/a.db").include == ()


@pytest.mark.parametrize("bad", ["myapp.tasks", ["myapp.tasks", 3], ["myapp/tasks.py"],
                                 ["myapp.tasks:app"], [""], ["my app"]])
def test_include_refuses_what_is_not_a_list_of_module_names(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ConfigurationError, match="include"):
        Conveyor(f"sqlite:///{tmp_path}/a.db", include=bad)  # type: ignore[arg-type]


# -- the registry -----------------------------------------------------------------------------
def test_import_includes_registers_the_tasks_of_every_module(project: Project) -> None:
    __import__(project.app_module)
    app = project.app
    assert app.tasks == {}
    loaded = app.import_includes()
    assert set(app.tasks) == {f"{project.mail}.send_welcome", f"{project.mail}.send_digest",
                              f"{project.billing}.invoice_all"}
    assert loaded == {project.mail: [f"{project.mail}.send_digest",
                                     f"{project.mail}.send_welcome"],
                      project.billing: [f"{project.billing}.invoice_all"]}
    assert "nightly-invoices" in app.schedules
    assert app.import_includes() == loaded  # again: nothing new, nothing imported twice


def test_a_module_that_fails_to_import_raises_naming_it(project: Project) -> None:
    (project.root / f"{project.billing}.py").write_text("import os\n\nos.environ['INC_UNSET_X']\n")
    __import__(project.app_module)
    with pytest.raises(ConfigurationError, match=f"cannot import {project.billing}: KeyError") as e:
        project.app.import_includes()
    assert isinstance(e.value.__cause__, KeyError)


# -- the command line -------------------------------------------------------------------------
def test_enqueue_and_cron_list_see_the_tasks_of_included_modules(project: Project) -> None:
    result = project.invoke("enqueue", f"{project.mail}.send_welcome", "--args", '["ada"]',
                            "--app", project.spec)
    assert result.exit_code == 0, result.output
    crons = project.invoke("cron", "list", "--app", project.spec)
    assert crons.exit_code == 0, crons.output
    assert "nightly-invoices" in crons.stdout


def test_an_include_that_fails_to_import_is_one_line_with_file_and_line(
        project: Project) -> None:
    broken = project.root / f"{project.billing}.py"
    broken.write_text("import os\n\nSETTING = os.environ['CONVEYOR_TEST_UNSET_SETTING']\n")
    result = project.invoke("enqueue", f"{project.mail}.send_welcome", "--args", '["ada"]',
                            "--app", project.spec)
    assert result.exit_code == 1
    [message] = result.stderr.strip().splitlines()
    assert message == (f"error: cannot import {project.billing}: KeyError: "
                       f"'CONVEYOR_TEST_UNSET_SETTING' ({project.billing}.py:3); "
                       "--verbose for the traceback")
    assert not (project.root / "inc.db").exists(), "a store was created for a failed command"
    verbose = project.invoke("enqueue", f"{project.mail}.send_welcome", "--args", '["ada"]',
                             "--app", project.spec, "--verbose")
    assert verbose.exit_code == 1
    assert "Traceback" in verbose.stderr and f"{project.billing}.py" in verbose.stderr
    assert verbose.stderr.strip().splitlines()[-1].startswith(
        f"error: cannot import {project.billing}: KeyError")


def test_a_missing_include_is_one_line(project: Project) -> None:
    project.write([project.mail, f"{project.prefix}nosuch"])
    result = project.invoke("cron", "list", "--app", project.spec)
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        f"error: cannot import {project.prefix}nosuch: ModuleNotFoundError: No module named "
        f"'{project.prefix}nosuch'; --verbose for the traceback"]


# -- the worker -------------------------------------------------------------------------------
def test_a_worker_imports_the_includes_and_logs_the_tasks_per_module(
        project: Project, caplog: pytest.LogCaptureFixture) -> None:
    __import__(project.app_module)
    app = project.app
    caplog.set_level(logging.INFO, logger="conveyor.worker")
    with running_worker(app, queues="default") as wt:
        job = app.get_task(f"{project.mail}.send_welcome").enqueue("ada")
        done = wait_for_job(app, job.id)
        worker_id = wt.worker.id
    assert done.state is JobState.SUCCEEDED and done.result == "welcome ada"
    lines = [r.getMessage() for r in caplog.records if r.name == "conveyor.worker"]
    assert f"worker {worker_id} tasks from {project.mail}: send_digest, send_welcome" in lines
    assert f"worker {worker_id} tasks from {project.billing}: invoice_all" in lines


def test_a_worker_of_an_app_with_a_broken_include_fails_at_construction(
        project: Project) -> None:
    project.write([project.mail, f"{project.prefix}nosuch"])
    __import__(project.app_module)
    with pytest.raises(ConfigurationError, match=f"cannot import {project.prefix}nosuch"):
        Worker(project.app, install_signal_handlers=False)


def test_the_dashboard_knows_the_tasks_of_included_modules(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    import conveyor.dashboard

    served: list[Conveyor] = []
    monkeypatch.setattr(conveyor.dashboard, "serve", lambda app, **_: served.append(app))
    result = project.invoke("dashboard", "--app", project.spec)
    assert result.exit_code == 0, result.output
    [app] = served
    assert f"{project.mail}.send_welcome" in app.tasks
