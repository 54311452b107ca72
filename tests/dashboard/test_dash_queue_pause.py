"""Pause and resume a queue from the dashboard (issue 38): a POST with the CSRF token from the
queue page or the overview's queues table, a "paused" badge, and every forgery refused. On every
backend."""

from __future__ import annotations

import re

from dashkit import ORIGIN, csrf_of, enqueue, make_client, post
from starlette.testclient import TestClient

from conveyor import Conveyor
from conveyor.dashboard import DashboardApp, create_app

BADGE = re.compile(r'class="pill warn"[^>]*>paused<')


def act(client: TestClient, path: str, form: dict[str, str] | None = None) -> str:
    """Post the action (one click, no confirmation page); the page shown after, with its flash."""
    done = post(client, path, form or {})
    assert done.status_code == 303, done.text
    after = client.get(done.headers["location"])
    assert after.status_code == 200
    return after.text


def test_pause_and_resume_from_the_queue_page(app: Conveyor, client: TestClient) -> None:
    enqueue(app.backend, "mail")
    page = client.get("/queues/mail").text
    assert not BADGE.search(page)
    assert 'action="/queues/mail/pause"' in page and ">Pause</button>" in page

    after = act(client, "/queues/mail/pause", {"next": "/queues/mail"})
    assert "Queue mail is paused" in after
    assert BADGE.search(after) and "Paused since" in after
    assert 'action="/queues/mail/resume"' in after and ">Resume</button>" in after
    assert app.backend.paused_queues().keys() == {"mail"}
    assert "was paused already" in act(client, "/queues/mail/pause")

    after = act(client, "/queues/mail/resume", {"next": "/queues/mail"})
    assert "Queue mail is resumed" in after and not BADGE.search(after)
    assert app.backend.paused_queues() == {}
    assert "was not paused" in act(client, "/queues/mail/resume")


def test_the_overview_table_shows_the_badge_and_the_button(app: Conveyor,
                                                           client: TestClient) -> None:
    enqueue(app.backend, "mail")
    enqueue(app.backend, "other")
    after = act(client, "/queues/mail/pause", {"next": "/"})
    row = re.search(r'<tr data-queue="mail">.*?</tr>', after, re.S)
    other = re.search(r'<tr data-queue="other">.*?</tr>', after, re.S)
    assert row and other
    assert BADGE.search(row.group(0)) and 'data-action="resume"' in row.group(0)
    assert not BADGE.search(other.group(0)) and 'data-action="pause"' in other.group(0)


def test_a_paused_queue_without_jobs_has_a_page(app: Conveyor, client: TestClient) -> None:
    assert client.get("/queues/later").status_code == 404
    app.backend.pause_queue("later")
    page = client.get("/queues/later")
    assert page.status_code == 200 and BADGE.search(page.text)


def test_unknown_actions_and_bad_names_are_refused(app: Conveyor, client: TestClient) -> None:
    assert post(client, "/queues/mail/drop", {}).status_code == 404
    assert post(client, "/queues/bad%20name/pause", {}).status_code == 400
    assert app.backend.paused_queues() == {}


def test_forgeries_change_nothing(app: Conveyor, dash: DashboardApp, client: TestClient) -> None:
    path = "/queues/mail/pause"
    token = csrf_of(client)
    with make_client(dash) as other:
        foreign = csrf_of(other)
    assert client.get(path).status_code == 405
    assert client.post(path, data={"next": "/"}, headers=ORIGIN).status_code == 403  # no token
    assert post(client, path, {}, token=foreign).status_code == 403
    assert post(client, path, {}, token=token,
                headers={"Origin": "https://evil.example"}).status_code == 403
    with make_client(dash, client=("203.0.113.7", 40000)) as remote:  # not loopback, no auth
        assert remote.post(path, data={"csrf_token": token}, headers=ORIGIN).status_code == 403
    assert app.backend.paused_queues() == {}
    assert post(client, path, {}, token=token).status_code == 303  # done right, it acts
    assert app.backend.paused_queues().keys() == {"mail"}


def test_with_a_token_only_a_signed_in_operator_may_pause(app: Conveyor) -> None:
    dash = create_app(app, token="Vb3kQ9xLr7TmN2pWz5YcH8dJ4sFgA6eU0iOwR1qZtKy",
                      sample_interval=3600)
    try:
        with make_client(dash) as c:
            r = c.post("/queues/mail/pause", data={"next": "/"}, headers=ORIGIN)
            assert r.status_code in (303, 401, 403)
            assert r.status_code != 303 or "/login" in r.headers["location"]
    finally:
        dash.close()
    assert app.backend.paused_queues() == {}


def test_a_queue_named_with_braces_links_pauses_and_resumes(app: Conveyor,
                                                             client: TestClient) -> None:
    """Braces (a Redis hash tag) are allowed in queue names: every link to such a queue carries
    them percent-encoded, and one named like a route placeholder stays itself."""
    for name in ("emails{acme}", "{action}"):
        enqueue(app.backend, name)
        quoted = name.replace("{", "%7B").replace("}", "%7D")
        overview = client.get("/").text
        assert f'href="/queues/{quoted}"' in overview
        assert f'action="/queues/{quoted}/pause"' in overview
        page = client.get(f"/queues/{quoted}")
        assert page.status_code == 200 and f"/jobs?queue={quoted}" in page.text
        after = act(client, f"/queues/{quoted}/pause")  # back to the queue's page by default
        assert f"Queue {name} is paused" in after and BADGE.search(after)
        assert name in app.backend.paused_queues()
        after = act(client, f"/queues/{quoted}/resume", {"next": f"/queues/{quoted}"})
        assert f"Queue {name} is resumed" in after
    assert app.backend.paused_queues() == {}
