"""`conveyor queue pause|resume|list` (issue 38): the pause is the store's, so a worker of any
process sees what the CLI did; on every backend."""

from __future__ import annotations

import json
import re

from click.testing import CliRunner

from conveyor import Conveyor
from conveyor.cli import cli

WIDE = {"COLUMNS": "250"}


def run(url: str, *args: str, code: int = 0) -> str:
    result = CliRunner().invoke(cli, ["--url", url, *args], env=WIDE)
    assert result.exit_code == code, result.output
    return result.output


def test_pause_list_and_resume(store_url: str) -> None:
    app = Conveyor(store_url)

    @app.task(name="mail.send", queue="mail")
    def send() -> None:
        return None

    try:
        send.enqueue()
        send.enqueue()
        assert "paused queue mail" in run(store_url, "queue", "pause", "mail")
        assert app.backend.paused_queues().keys() == {"mail"}
        assert "was paused already" in run(store_url, "queue", "pause", "mail")
        # A queue may be paused before it has any job.
        run(store_url, "queue", "pause", "reports")

        listed = {q["queue"]: q for q in json.loads(run(store_url, "queue", "list", "--json"))}
        assert listed["mail"]["depth"] == 2 and listed["mail"]["paused"] is True
        assert listed["mail"]["paused_since"] == app.backend.paused_queues()["mail"]
        assert listed["mail"]["oldest_waiting_s"] is not None
        assert listed["reports"]["depth"] == 0 and listed["reports"]["paused"] is True

        table = run(store_url, "queue", "list")
        mail = re.search(r"^\W*mail\W+(\d+)\b.*$", table, re.M)
        assert mail and mail.group(1) == "2"
        assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", mail.group(0))  # paused since

        assert "resumed queue mail" in run(store_url, "queue", "resume", "mail")
        assert "was not paused" in run(store_url, "queue", "resume", "mail")
        assert app.backend.paused_queues().keys() == {"reports"}
        listed = {q["queue"]: q for q in json.loads(run(store_url, "queue", "list", "--json"))}
        assert listed["mail"]["paused"] is False and listed["mail"]["paused_since"] is None
        mail = re.search(r"^\W*mail\W.*$", run(store_url, "queue", "list"), re.M)
        assert mail and mail.group(0).rstrip(" │").endswith("-")
    finally:
        app.close()


def test_a_bad_queue_name_is_refused(store_url: str) -> None:
    app = Conveyor(store_url)
    app.backend.enqueue_many([])  # the store exists
    app.close()
    out = run(store_url, "queue", "pause", "no spaces", code=2)
    assert "invalid queue name" in out
