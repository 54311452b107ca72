"""The CLI on huge job data: `jobs list` / `jobs show` / `dlq show` clip what they print before
masking it, so a 2,000,000-character result or a 60,000-character argument shows at once,
still without its secrets. `--json` keeps everything (masked)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conveyor import cli as cli_mod
from conveyor.backends import open_backend
from conveyor.backends.base import ErrorInfo, Lease, NewJob
from conveyor.cli import cli

SECRET = "hunter2-canary"
HUGE = 2_000_000


@pytest.fixture
def store(tmp_path: Path) -> tuple[str, int, int]:
    """(store URL, id of a succeeded job with a huge result, id of a dead job with a huge arg)."""
    url = f"sqlite:///{tmp_path}/big.db"
    b = open_backend(url)
    try:
        ok, dead = b.enqueue_many([
            NewJob(task="t.big", queue="q", args=json.dumps({"n": 1}), max_attempts=1, timeout=30),
            NewJob(task="t.bad", queue="q", args=json.dumps({"blob": "A:" * 30_000, "dsn": f"postgres://u:{SECRET}@h/d"}),
                   max_attempts=1, timeout=30),
        ])
        a, d = b.claim("q", 2, worker_id="w", lease_s=30)
        assert a.lease_token and d.lease_token
        b.ack(Lease(a.id, a.lease_token), json.dumps(f"redis://:{SECRET}@cache/0 " + "x" * HUGE))
        b.kill(Lease(d.id, d.lease_token), ErrorInfo("exception", f"password={SECRET} " + "a:" * 1000, "ValueError", ""))
        return url, ok.id, dead.id
    finally:
        b.close()


@pytest.fixture(autouse=True)
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_mod.console, "width", 2000)  # rich would cut long cells at 80 columns


def run(url: str, *args: str) -> str:
    result = CliRunner().invoke(cli, ["--url", url, *args], env={"COLUMNS": "2000"})
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.timeout(60)
def test_jobs_list_and_show_clip_a_huge_result(store: tuple[str, int, int]) -> None:
    url, ok, _ = store
    listed = run(url, "jobs", "list")
    assert f"{ok}" in listed and len(listed) < 10_000 and SECRET not in listed
    shown = run(url, "jobs", "show", str(ok))
    assert SECRET not in shown and "redis://:***@cache/0" in shown.replace("\n", "")
    assert len(shown) < 50_000 and "more characters" in shown
    everything = run(url, "jobs", "show", "--json", str(ok))
    assert len(everything) > HUGE and SECRET not in everything


@pytest.mark.timeout(60)
def test_dlq_clips_a_huge_argument(store: tuple[str, int, int]) -> None:
    url, _, dead = store
    listed = run(url, "dlq", "list")
    assert f"{dead}" in listed and len(listed) < 10_000 and SECRET not in listed
    shown = run(url, "dlq", "show", str(dead))
    assert SECRET not in shown and "password=***" in shown
    assert len(shown) < 50_000 and "more characters" in shown


def test_job_data_prints_as_written(tmp_path: Path) -> None:
    """Text like `:smile:` in job data is not turned into an emoji, nor `[red]` into markup."""
    url = f"sqlite:///{tmp_path}/e.db"
    b = open_backend(url)
    try:
        [res] = b.enqueue_many([NewJob(task="t.e", queue="q", args=json.dumps({"s": "a:smile:b [red]x[/red]"}),
                                       max_attempts=1, timeout=30)])
    finally:
        b.close()
    for args in (["jobs", "show", str(res.id)], ["jobs", "list"]):
        out = run(url, *args)
        assert "a:smile:b [red]x[/red]" in out, out
