"""`conveyor jobs bulk` and `conveyor dlq groups` (issue 38), on SQLite."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from support import new_job

from conveyor import JobState
from conveyor.backends import open_backend
from conveyor.backends.base import Backend, ErrorInfo, Lease
from conveyor.cli import cli
from conveyor.cli.commands.bulk import parse_time

WIDE = {"COLUMNS": "250"}


def invoke(url: str, *args: str, stdin: str | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--url", url, *args], env=WIDE, input=stdin)
    return result.exit_code, result.output


def dead(backend: Backend, message: str, task: str = "t.a") -> int:
    [res] = backend.enqueue_many([new_job(task=task)])
    [job] = [j for j in backend.claim("default", 100, worker_id="w", lease_s=30)
             if j.id == res.id]
    backend.kill(Lease(job.id, job.lease_token or ""), ErrorInfo("exception", message,
                                                                 type="KeyError"))
    return res.id


def store(tmp_path: Path) -> tuple[str, Backend]:
    url = f"sqlite:///{tmp_path}/c.db"
    return url, open_backend(url)


def test_dlq_groups_lists_causes_with_keys(tmp_path: Path) -> None:
    url, backend = store(tmp_path)
    for i in range(3):
        dead(backend, f"KeyError: 'user_{i}'")
    dead(backend, "boom", task="t.b")
    code, out = invoke(url, "dlq", "groups")
    assert code == 0, out
    assert "KeyError: KeyError: <str>" in out and "t.b" in out
    code, out = invoke(url, "dlq", "groups", "--json")
    data = json.loads(out)
    assert data["complete"] is True
    assert [g["count"] for g in data["groups"]] == [3, 1]
    assert data["groups"][0]["key"] == backend.error_groups().groups[0].key


def test_bulk_retry_of_one_group_asks_first_and_reports_progress(tmp_path: Path) -> None:
    url, backend = store(tmp_path)
    group = [dead(backend, f"KeyError: 'user_{i}'") for i in range(3)]
    other = dead(backend, "boom", task="t.b")
    key = backend.error_groups().groups[0].key

    code, out = invoke(url, "jobs", "bulk", "retry", "--error-group", key, stdin="n\n")
    assert code == 1  # declined: nothing done
    assert "3 job(s) match: retry them" in out and "Retry 3 job(s)?" in out
    assert {backend.get(i).state for i in group} == {JobState.DEAD}  # type: ignore[union-attr]

    code, out = invoke(url, "jobs", "bulk", "retry", "--error-group", key, "--batch", "2",
                       stdin="y\n")
    assert code == 0, out
    assert "2 done" in out and "3 done" in out and "retry: 3 job(s) done" in out
    assert {backend.get(i).state for i in group} == {JobState.AVAILABLE}  # type: ignore[union-attr]
    assert backend.get(other).state is JobState.DEAD  # type: ignore[union-attr]


def test_bulk_cancel_with_yes_and_a_time_range(tmp_path: Path) -> None:
    url, backend = store(tmp_path)
    now = backend.now()

    old, new = backend.enqueue_many([new_job(queue="q1")], now=now - 7200) + \
        backend.enqueue_many([new_job(queue="q1")], now=now)
    code, out = invoke(url, "jobs", "bulk", "cancel", "--queue", "q1", "--until", "1h", "--yes")
    assert code == 0, out
    assert "1 job(s) match" in out and "cancel: 1 job(s) done" in out
    assert backend.get(old.id).state is JobState.CANCELLED  # type: ignore[union-attr]
    assert backend.get(new.id).state is JobState.AVAILABLE  # type: ignore[union-attr]
    code, out = invoke(url, "jobs", "bulk", "delete", "--state", "available", "--yes")
    assert code == 0 and "0 job(s) match" in out  # delete takes finished jobs only


def test_parse_time(tmp_path: Path) -> None:
    assert parse_time(None, 1000.0) is None
    assert parse_time("90s", 1000.0) == 910.0
    assert parse_time("2h", 10_000.0) == 10_000.0 - 7200
    assert parse_time("1700000000", 0) == 1_700_000_000.0
    assert parse_time("2023-11-14T22:13:20", 0) == 1_700_000_000.0
    code, out = invoke(store(tmp_path)[0], "jobs", "bulk", "cancel", "--since", "soon")
    assert code != 0 and "30m, 2h, 7d" in out
