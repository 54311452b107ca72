"""Retry, cancel, redrive and purge through the dashboard change the store as they say: one job,
selected jobs, or all (of a queue), each after a confirmation page."""

from __future__ import annotations

from dashkit import enqueue, kill_job, post
from starlette.testclient import TestClient

from conveyor import Conveyor
from conveyor.job import JobState


def state(app: Conveyor, job_id: int) -> str | None:
    job = app.backend.get(job_id)
    return None if job is None else str(job.state)


def confirm(client: TestClient, path: str, form: dict[str, str]) -> str:
    """Post the action, check it asked first, confirm it; returns the flash shown after."""
    page = post(client, path, form)
    assert page.status_code == 200 and 'name="confirmed" value="yes"' in page.text, page.text[:500]
    done = post(client, path, {**form, "confirmed": "yes"})
    assert done.status_code == 303, done.text
    after = client.get(done.headers["location"])
    assert after.status_code == 200
    return after.text


def test_retry_a_dead_job(app: Conveyor, client: TestClient) -> None:
    dead = kill_job(app.backend)
    flash = confirm(client, f"/jobs/{dead}/retry", {})
    assert "is back on queue default" in flash
    job = app.get_job(dead)
    assert job.state is JobState.AVAILABLE and job.attempts == 0 and job.errors  # errors kept


def test_retry_of_a_job_that_is_not_dead_changes_nothing(app: Conveyor, client: TestClient) -> None:
    [waiting] = enqueue(app.backend)
    flash = confirm(client, f"/jobs/{waiting}/retry", {})
    assert "only dead jobs can be" in flash
    assert state(app, waiting) == "available"


def test_cancel_a_waiting_job(app: Conveyor, client: TestClient) -> None:
    [waiting] = enqueue(app.backend)
    assert "is cancelled" in confirm(client, f"/jobs/{waiting}/cancel", {})
    assert state(app, waiting) == "cancelled"
    assert "already finished" in confirm(client, f"/jobs/{waiting}/cancel", {})


def test_purge_one_dead_job(app: Conveyor, client: TestClient) -> None:
    dead, other = kill_job(app.backend), kill_job(app.backend)
    assert "was purged" in confirm(client, f"/jobs/{dead}/purge", {})
    assert state(app, dead) is None and state(app, other) == "dead"


def test_redrive_and_purge_selected(app: Conveyor, client: TestClient) -> None:
    a, b, c = (kill_job(app.backend) for _ in range(3))
    assert "Redrove 2 job(s)" in confirm(client, "/dead/redrive", {"ids": [str(a), str(b)]})  # type: ignore[dict-item]
    assert (state(app, a), state(app, b), state(app, c)) == ("available", "available", "dead")
    flash = confirm(client, "/dead/purge", {"ids": [str(c), str(a)]})  # type: ignore[dict-item]
    assert "Purged 1 dead job(s) (1 were no longer dead)" in flash
    assert state(app, c) is None and state(app, a) == "available"


def test_redrive_all_of_one_queue_then_purge_all(app: Conveyor, client: TestClient) -> None:
    x = [kill_job(app.backend, "x") for _ in range(2)]
    y = kill_job(app.backend, "y")
    page = post(client, "/dead/redrive", {"all": "yes", "queue": "x"})
    assert "every dead job on queue x: 2 job(s)" in page.text
    assert "Redrove 2 job(s)" in confirm(client, "/dead/redrive", {"all": "yes", "queue": "x"})
    assert [state(app, i) for i in x] == ["available", "available"] and state(app, y) == "dead"
    assert "Purged 1 dead job(s)" in confirm(client, "/dead/purge", {"all": "yes", "queue": ""})
    assert state(app, y) is None and [state(app, i) for i in x] == ["available", "available"]


def test_bulk_action_without_a_selection(app: Conveyor, client: TestClient) -> None:
    dead = kill_job(app.backend)
    r = post(client, "/dead/redrive", {"confirmed": "yes"})
    assert r.status_code == 303
    assert "Select one or more jobs first" in client.get(r.headers["location"]).text
    assert state(app, dead) == "dead"
    assert post(client, "/dead/redrive", {"ids": "12;DROP TABLE"}).status_code == 400
    assert post(client, "/dead/nuke", {"all": "yes", "confirmed": "yes"}).status_code == 404
    assert post(client, f"/jobs/{dead}/explode", {"confirmed": "yes"}).status_code == 404
    assert state(app, dead) == "dead"


def test_after_an_action_the_page_goes_back_where_it_was(app: Conveyor, client: TestClient) -> None:
    dead = kill_job(app.backend, "x")
    r = post(client, "/dead/redrive", {"ids": str(dead), "confirmed": "yes", "next": "/dead?queue=x"})
    assert r.headers["location"] == "/dead?queue=x"
    other = kill_job(app.backend, "x2")  # not x: its claim would pick the redriven job
    r = post(client, "/dead/redrive", {"ids": str(other), "confirmed": "yes", "next": "https://evil.example/"})
    assert r.headers["location"] == "/dead"
