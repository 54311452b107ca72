"""docs/workflows.md's first example, run as printed on SQLite: the chain with a group and
pass_result gives the result the page says, and the batch's callback runs once."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from conveyor import JobState
from conveyor.testing import drain

PAGE = Path(__file__).resolve().parents[2] / "docs" / "workflows.md"


def test_the_first_example_does_what_the_page_says(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    text = PAGE.read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S)
    assert code is not None
    (tmp_path / "workflows.py").write_text(code.group(1))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("CONVEYOR_URL", raising=False)
    import workflows  # type: ignore[import-not-found]

    try:
        assert workflows.app.backend.list_jobs().jobs == []  # importing enqueues nothing
        steps, b = workflows.start()
        drain(workflows.app)
        last = workflows.app.get_job(steps[-1].id)
        assert b.on_success_job is not None and b.on_complete_job is not None
        report = workflows.app.get_job(b.on_success_job.id)
        cleanup = workflows.app.get_job(b.on_complete_job.id)
    finally:
        workflows.app.close()
        sys.modules.pop("workflows", None)
    said = re.search(r'`steps\[-1\]\.wait\(\)` gives\s+`"(.*?)"`', text)
    assert said is not None and last.result == said.group(1)
    said = re.search(r'`b\.on_success_job\.wait\(\)` gives\s+`"(.*?)"`', text)
    assert said is not None and report.result == said.group(1)
    assert cleanup.state is JobState.SUCCEEDED
    assert os.path.exists(tmp_path / "workflows.db")
