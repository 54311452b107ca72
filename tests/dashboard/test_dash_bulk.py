"""Error groups and bulk actions in the dashboard (issue 38): the dead page groups jobs by cause,
a group's page redrives or purges it, and the jobs page acts on its whole filter after a
confirmation showing the count, in batches (repeated POSTs carrying a cursor)."""

from __future__ import annotations

import re

from dashkit import enqueue, kill_job, post
from starlette.testclient import TestClient

from conveyor import Conveyor
from conveyor.bulk import BULK_BATCH
from conveyor.job import JobState


def run_to_end(client: TestClient, path: str, form: dict[str, str]) -> tuple[str, int]:
    """Confirm, then post each next batch as the progress page would: (final flash, posts)."""
    page = post(client, path, {**form, "confirmed": "yes"})
    posts = 1
    while page.status_code == 200:
        assert 'id="bulk-next"' in page.text, page.text[:500]
        fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">',
                                 page.text))
        fields.pop("csrf_token", None)
        page = post(client, path, fields)
        posts += 1
    assert page.status_code == 303, page.text
    return client.get(page.headers["location"]).text, posts


def test_dead_page_groups_jobs_by_cause_and_links_each_group(app: Conveyor,
                                                             client: TestClient) -> None:
    for i in range(3):
        kill_job(app.backend, args={"n": i})
    page = client.get("/dead")
    assert page.status_code == 200 and "Grouped by cause" in page.text
    [group] = app.backend.error_groups().groups
    assert f"/errors/{group.key}" in page.text
    detail = client.get(f"/errors/{group.key}")
    assert detail.status_code == 200
    assert 'id="group-count">3<' in detail.text and "Redrive all" in detail.text
    assert client.get("/errors/0123456789abcdef").status_code == 404
    assert client.get("/errors/nothex").status_code == 404


def test_redrive_a_group_after_confirming_its_count(app: Conveyor, client: TestClient) -> None:
    dead = [kill_job(app.backend) for _ in range(2)]
    [other] = enqueue(app.backend)
    [group] = app.backend.error_groups().groups
    form = {"state": "dead", "task": group.task, "error_group": group.key, "next": "/dead"}
    ask = post(client, "/bulk/retry", form)
    assert ask.status_code == 200 and "Retry 2 jobs?" in ask.text
    assert {app.get_job(i).state for i in dead} == {JobState.DEAD}  # asking changed nothing
    flash, _ = run_to_end(client, "/bulk/retry", form)
    assert "Retried 2 job(s)." in flash
    assert {app.get_job(i).state for i in dead} == {JobState.AVAILABLE}
    assert app.get_job(other).state is JobState.AVAILABLE


def test_purge_a_group(app: Conveyor, client: TestClient) -> None:
    dead = [kill_job(app.backend) for _ in range(2)]
    [group] = app.backend.error_groups().groups
    flash, _ = run_to_end(client, "/bulk/delete", {"state": "dead", "error_group": group.key})
    assert "Deleted 2 job(s)." in flash
    assert all(app.backend.get(i) is None for i in dead)


def test_bulk_cancel_of_a_filter_runs_in_batches(app: Conveyor, client: TestClient) -> None:
    n = BULK_BATCH + 3
    mine = enqueue(app.backend, "q1", n=n)
    [theirs] = enqueue(app.backend, "q2")
    jobs_page = client.get("/jobs", params={"queue": "q1"})
    assert 'id="bulk-cancel"' in jobs_page.text
    ask = post(client, "/bulk/cancel", {"queue": "q1", "next": "/jobs?queue=q1"})
    assert f"Cancel {n:,} jobs?" in ask.text
    flash, posts = run_to_end(client, "/bulk/cancel", {"queue": "q1", "next": "/jobs?queue=q1"})
    assert f"Cancelled {n:,} job(s)." in flash and posts == 2
    assert {app.get_job(i).state for i in mine} == {JobState.CANCELLED}
    assert app.get_job(theirs).state is JobState.AVAILABLE


def test_nothing_to_do_says_so(app: Conveyor, client: TestClient) -> None:
    enqueue(app.backend)
    page = post(client, "/bulk/delete", {"state": "available", "next": "/jobs"})
    assert page.status_code == 303
    assert "nothing to delete" in client.get(page.headers["location"]).text


def test_bulk_needs_csrf_and_refuses_bad_input(app: Conveyor, client: TestClient) -> None:
    [job] = enqueue(app.backend)
    refused = client.post("/bulk/cancel", data={"confirmed": "yes"})
    assert refused.status_code == 403
    assert app.get_job(job).state is JobState.AVAILABLE
    assert post(client, "/bulk/explode", {}).status_code == 404
    assert post(client, "/bulk/cancel", {"error_group": "x"}).status_code == 400
    assert post(client, "/bulk/cancel", {"since": "soon"}).status_code == 400
