"""The dashboard shows workflows (issue 35): waiting counts per queue, a job's parents, batch
and callback as links, a batch page with its counts, the waiting filter of the jobs page."""

from __future__ import annotations

import re

from starlette.testclient import TestClient

from conveyor import Conveyor


def cell(page: str, queue: str, col: str) -> str:
    row = re.search(rf'<tr data-queue="{queue}">(.*?)</tr>', page, re.S)
    assert row, page
    m = re.search(rf'data-col="{col}">(.*?)</td>', row.group(1), re.S)
    assert m, row.group(1)
    return re.sub(r"<[^>]+>", "", m.group(1)).strip()


def test_workflow_jobs_and_batches_on_the_dashboard(app: Conveyor, client: TestClient) -> None:
    @app.task(name="member")
    def member(n: int) -> int:
        return n

    @app.task(name="report")
    def report() -> None:
        return None

    parent = member.enqueue(0)
    child = member.options(after=[parent]).enqueue(1)
    with app.batch(on_success=report.s(), on_complete=report.s()) as b:
        member.enqueue(2)
        member.enqueue(3)
    ok, done = b.on_success_job, b.on_complete_job
    assert ok is not None and done is not None

    overview = client.get("/").text
    assert cell(overview, "default", "awaiting_parents") == "3"  # the child and two callbacks
    assert cell(overview, "default", "waiting") == "3"  # depth: parent and the two members
    assert 'href="/jobs?queue=default&amp;state=waiting"' in overview

    child_page = client.get(f"/jobs/{child.id}").text
    assert f'href="/jobs/{parent.id}"' in child_page
    assert "Parents" in child_page and "cancelled if a parent fails" in child_page
    assert 'id="cancel"' in child_page  # a waiting job can be cancelled

    member_page = client.get(f"/jobs/{b.jobs[0].id}").text
    assert f'href="/batches/{b.id}"' in member_page
    ok_page = client.get(f"/jobs/{ok.id}").text
    assert "Callback of" in ok_page and f'href="/batches/{b.id}"' in ok_page

    batch_page = client.get(f"/batches/{b.id}")
    assert batch_page.status_code == 200
    text = batch_page.text
    assert b.id in text and "0 of 2 finished" in text
    assert f'href="/jobs/{ok.id}"' in text and f'href="/jobs/{done.id}"' in text
    assert re.search(r'data-count="pending">\s*2<', text)

    waiting = client.get("/jobs?state=waiting").text
    assert f'href="/jobs/{child.id}"' in waiting and f'href="/jobs/{parent.id}"' not in waiting


def test_an_unknown_batch_is_a_404(client: TestClient) -> None:
    page = client.get("/batches/no-such-batch")
    assert page.status_code == 404
    assert "No such batch" in page.text
    assert client.get("/batches/" + "x" * 300).status_code == 404
