"""Pages with huge job data: a dead job with a 60,000-character argument and a long error
shows on every page at once, clipped before it is masked, and still without its secrets."""

from __future__ import annotations

import pytest
from dashkit import kill_job
from starlette.testclient import TestClient

from conveyor import Conveyor

SECRET = "hunter2-canary"


@pytest.mark.timeout(60)
def test_pages_clip_a_huge_argument_before_masking(app: Conveyor, client: TestClient) -> None:
    job_id = kill_job(app.backend, "big", args={"blob": "A" * 60_000, "more": "a:" * 30_000,
                                                "dsn": f"postgres://u:{SECRET}@h/d"},
                      message=f"token={SECRET} " + "x://a:" * 300, traceback="a@" * 20_000)
    for path in ("/", "/dead", "/jobs", "/jobs?q=AAAA", f"/jobs/{job_id}"):
        page = client.get(path)
        assert page.status_code == 200, path
        assert SECRET not in page.text, path
        assert len(page.text) < 120_000, path
    detail = client.get(f"/jobs/{job_id}").text
    assert "more characters" in detail and "&#34;blob&#34;: &#34;AAAA" in detail
