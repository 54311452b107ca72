"""The README's quickstart, run as printed: its Python blocks as the files they name, its first
shell block line by line (a worker in the background), on a SQLite file in a temporary
directory. A snippet that stops working (a helper it calls and does not define, a command or
option that does not exist) fails here."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import click
import pytest
from support import wait_until

from conveyor import Conveyor, JobState, Reject
from conveyor.cli import cli

README = Path(__file__).resolve().parent.parent / "README.md"
GETTING_STARTED = README.parent / "docs" / "getting-started.md"


def quickstart_blocks() -> list[tuple[str, str]]:
    """(language, code) of every fenced block in the README's Quickstart section, in order."""
    section = README.read_text().split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```(\w+)\n(.*?)^```", section, re.S | re.M)


def conveyor_command(argv: list[str]) -> list[str]:
    assert argv[0] == "conveyor", argv
    return [sys.executable, "-m", "conveyor", *argv[1:]]


@pytest.mark.process
def test_the_readme_quickstart_runs_as_printed(tmp_path: Path) -> None:
    blocks = quickstart_blocks()
    python = [code for lang, code in blocks if lang == "python"]
    shell = [code for lang, code in blocks if lang == "sh"]
    assert len(python) == 2 and len(shell) == 2, [lang for lang, _ in blocks]
    for code in python:  # each block says which file it is on its first line
        name = re.match(r"# (\S+\.py)\b", code)
        assert name, f"a quickstart Python block does not name its file: {code.splitlines()[0]!r}"
        path = tmp_path / name.group(1)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)

    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env["PYTHONPATH"] = str(tmp_path)
    enqueued = subprocess.run([sys.executable, "enqueue.py"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=60)
    assert enqueued.returncode == 0, enqueued.stderr
    first_id = int(enqueued.stdout.split()[0])

    app = Conveyor(f"sqlite:///{tmp_path}/conveyor.db")
    worker: subprocess.Popen[str] | None = None
    outputs: dict[str, str] = {}
    try:
        for line in shell[0].splitlines():
            argv = shlex.split(line, comments=True)
            if not argv:
                continue
            if argv[0] == "export":
                key, _, value = argv[1].partition("=")
                env[key] = value
            elif argv[-1] == "&":
                assert worker is None, "one background worker"
                worker = subprocess.Popen(conveyor_command(argv[:-1]), cwd=tmp_path, env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            else:
                done = subprocess.run(conveyor_command(argv), cwd=tmp_path, env=env, capture_output=True,
                                      text=True, timeout=60)
                assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
                outputs[argv[1]] = done.stdout
                if argv[1] == "enqueue":
                    # What the next commands show depends on the worker having run what is due.
                    def settled() -> bool:
                        return all(j.is_final for j in app.backend.list_jobs(limit=100).jobs
                                   if str(j.state) != "scheduled")

                    wait_until(settled, timeout=60, message="the worker to run the quickstart's jobs")
    finally:
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            out, err = worker.communicate(timeout=60)
    assert worker is not None and worker.returncode == 0, err

    cli_id = int(re.search(r"enqueued job (\d+)", outputs["enqueue"]).group(1))  # type: ignore[union-attr]
    for job_id in (first_id, cli_id):
        job = app.get_job(job_id)
        assert str(job.state) == "succeeded", job.errors
    assert out.count("sent to ada@example.com") == 2
    dead = app.backend.list_jobs(state=JobState.DEAD, limit=10).jobs
    assert sorted(j.args["user_id"] for j in dead) == [1, 2, 3]
    assert "no such user" in outputs["dlq"]
    assert f"sqlite:///{tmp_path}/conveyor.db" in err  # the worker's banner: the absolute path
    app.close()


def test_every_command_and_option_the_readme_lists_exists() -> None:
    """The reference block: placeholders (ID, [optional]) make it unrunnable, so each command
    it names is resolved in the CLI and each --option checked against that command."""
    reference = [code for lang, code in quickstart_blocks() if lang == "sh"][1]
    checked = 0
    for line in reference.splitlines():
        words = shlex.split(re.sub(r"[\[\]]", " ", line), comments=True)
        if not words:
            continue
        assert words[0] == "conveyor", line
        for segment in " ".join(words[1:]).split("|"):
            tokens = segment.split()
            command: click.Command = cli
            while isinstance(command, click.Group) and tokens and tokens[0] in command.commands:
                command = command.commands[tokens.pop(0)]
            assert command is not cli and not isinstance(command, click.Group), f"no such command: {segment}"
            known = {opt for param in command.params for opt in getattr(param, "opts", [])}
            known |= {opt for param in command.params for opt in getattr(param, "secondary_opts", [])}
            for option in (t for t in tokens if t.startswith("--")):
                assert option in known, f"{segment.strip()}: {command.name} has no {option}"
            checked += 1
    assert checked >= 10


def test_the_getting_started_task_module_defines_what_it_calls(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/getting-started.md's myproject/jobs.py, imported and its task called in-process."""
    [code] = [c for c in re.findall(r"^```python\n(.*?)^```", GETTING_STARTED.read_text(), re.S | re.M)
              if c.startswith("# myproject/jobs.py")]
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "myproject.jobs"}
    exec(compile(code, "myproject/jobs.py", "exec"), namespace)
    app, task = namespace["app"], namespace["send_welcome_email"]
    assert isinstance(app, Conveyor) and app.url == f"sqlite:///{tmp_path}/conveyor.db"
    task(42)  # type: ignore[operator]
    with pytest.raises(Reject):
        task(7)  # type: ignore[operator]
