"""examples/flask_signup: a sign-up and its welcome email job commit together, or not at all;
the email task is safe to run twice."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import ModuleType

import psycopg
import pytest
from flask.testing import FlaskClient
from support import running_worker, wait_for_job

from conveyor import JobState
from conveyor.cli import load_app


@pytest.fixture
def signup(pg_url: str, load_example: Callable[..., ModuleType]) -> Iterator[tuple[ModuleType, FlaskClient]]:
    web = load_example("flask_signup.web", DATABASE_URL=pg_url)
    flask_app = web.create_app()
    flask_app.testing = True
    try:
        yield web, flask_app.test_client()
    finally:
        flask_app.extensions["pool"].close()


def _rows(pg_url: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(pg_url) as conn:
        return conn.execute(sql).fetchall()


def test_a_signup_commits_with_its_job_and_the_worker_sends_one_email(
    signup: tuple[ModuleType, FlaskClient], pg_url: str
) -> None:
    web, client = signup
    r = client.post("/signup", json={"email": "ada@example.com"})
    assert r.status_code == 201, r.get_data(as_text=True)
    body = r.get_json()
    app = web.jobs.app
    job = app.get_job(body["welcome_job_id"])
    assert job.state is JobState.AVAILABLE and job.queue == "emails"
    assert job.args == {"user_id": body["user_id"]}

    assert load_app("flask_signup.jobs:app") is app  # the README's worker command
    with running_worker(app, queues="emails"):
        done = wait_for_job(app, job.id)
    assert done.state is JobState.SUCCEEDED, done.errors
    assert done.result is True
    assert _rows(pg_url, "SELECT recipient, idempotency_key FROM outbox") == [
        ("ada@example.com", f"welcome:{body['user_id']}")
    ]

    # At-least-once: the same job run again (as after a crash before its ack) sends nothing new.
    assert web.jobs.send_welcome_email(body["user_id"]) is False
    assert len(_rows(pg_url, "SELECT * FROM outbox")) == 1


def test_a_rejected_signup_leaves_no_user_and_no_job(
    signup: tuple[ModuleType, FlaskClient], pg_url: str
) -> None:
    web, client = signup
    r = client.post("/signup", json={"email": "ada@example.com"})
    assert r.status_code == 201
    referrer = r.get_json()

    # An unknown referral code fails the request after the job was enqueued: both roll back.
    r = client.post("/signup", json={"email": "bob@example.com", "referral_code": "nope"})
    assert r.status_code == 400, r.get_data(as_text=True)
    # So does a duplicate email (the insert fails before any enqueue).
    r = client.post("/signup", json={"email": "ada@example.com"})
    assert r.status_code == 409

    app = web.jobs.app
    jobs = app.backend.list_jobs(limit=100).jobs
    assert [j.id for j in jobs] == [referrer["welcome_job_id"]]
    assert _rows(pg_url, "SELECT email FROM users ORDER BY id") == [("ada@example.com",)]

    # A good referral code commits the user, the credit and the job together.
    r = client.post("/signup", json={"email": "bob@example.com", "referral_code": referrer["referral_code"]})
    assert r.status_code == 201
    assert client.get(f"/users/{referrer['user_id']}").get_json()["credits"] == 10
    with running_worker(app, queues="emails"):
        for j in app.backend.list_jobs(limit=100).jobs:
            assert wait_for_job(app, j.id).state is JobState.SUCCEEDED
    assert sorted(r[0] for r in _rows(pg_url, "SELECT recipient FROM outbox")) == [
        "ada@example.com", "bob@example.com"
    ]
