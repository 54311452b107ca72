"""The cron page's controls: each schedule's status, last run (with a link) and next tick, and
the Run now / Disable / Enable buttons (CSRF-checked posts), on every store."""

from __future__ import annotations

from dashkit import csrf_of, post
from starlette.testclient import TestClient

from conveyor import Conveyor
from conveyor.backends.base import ErrorInfo, Lease
from conveyor.cron import Scheduler


def _schedule(app: Conveyor) -> None:
    @app.cron("*/5 * * * *", name="nightly")
    def report() -> None: ...


def test_disable_and_enable_from_the_cron_page(app: Conveyor, client: TestClient) -> None:
    _schedule(app)
    page = client.get("/cron").text
    assert 'id="disable-nightly"' in page and ">enabled<" in page
    token = csrf_of(client, "/cron")
    r = post(client, "/cron/nightly/disable", {}, token=token)
    assert r.status_code == 303 and r.headers["location"] == "/cron"
    assert app.backend.cron_states()["nightly"].disabled
    page = client.get("/cron").text
    assert "is disabled" in page  # the flash
    assert ">disabled<" in page and 'id="enable-nightly"' in page and "(skipped)" in page
    again = post(client, "/cron/nightly/disable", {}, token=token)
    assert again.status_code == 303
    assert "already disabled" in client.get("/cron").text

    r = post(client, "/cron/nightly/enable", {}, token=token)
    assert r.status_code == 303
    assert not app.backend.cron_states()["nightly"].disabled
    assert 'id="disable-nightly"' in client.get("/cron").text


def test_run_now_enqueues_one_manual_run_and_links_to_it(app: Conveyor, client: TestClient) -> None:
    _schedule(app)
    r = post(client, "/cron/nightly/run", {}, token=csrf_of(client, "/cron"))
    assert r.status_code == 303
    [job] = app.backend.list_jobs(limit=10).jobs
    assert r.headers["location"] == f"/jobs/{job.id}"
    assert job.meta["cron"]["manual"] is True
    assert "nightly" not in app.backend.cron_ticks()  # the schedule did not move
    assert f"job #{job.id} enqueued" in client.get(f"/jobs/{job.id}").text


def test_the_last_runs_outcome_links_to_its_job(app: Conveyor, client: TestClient) -> None:
    _schedule(app)
    scheduler = Scheduler(app)
    scheduler.run_pending(now=1_767_225_600.0 + 60)
    [made] = scheduler.run_pending(now=1_767_225_600.0 + 5 * 60 + 1)
    [job] = app.backend.claim(app.schedules["nightly"].queue, 1, worker_id="w", lease_s=30)
    assert job.lease_token is not None
    app.backend.kill(Lease(job.id, job.lease_token),
                     ErrorInfo("exception", "disk full", "OSError", "Traceback ..."))
    page = client.get("/cron").text
    assert f'href="/jobs/{made.id}"' in page and "st-dead" in page
    assert "OSError: disk full" in page


def test_unknown_schedules_and_actions_change_nothing(app: Conveyor, client: TestClient) -> None:
    _schedule(app)
    token = csrf_of(client, "/cron")
    r = post(client, "/cron/nope/disable", {}, token=token)
    assert r.status_code == 303 and "nope" not in app.backend.cron_states()
    assert "no cron schedule of that name" in client.get("/cron").text
    assert post(client, "/cron/nightly/explode", {}, token=token).status_code == 404
    assert post(client, "/cron/nope/run", {}, token=token).status_code == 303
    assert app.backend.list_jobs(limit=10).jobs == []


def test_cron_actions_need_the_csrf_token(app: Conveyor, client: TestClient) -> None:
    _schedule(app)
    client.get("/cron")
    r = client.post("/cron/nightly/disable", data={"confirmed": "yes"}, headers={"Origin": "http://127.0.0.1:8000"})
    assert r.status_code == 403
    r = post(client, "/cron/nightly/run", {}, token="0" * 64)
    assert r.status_code == 403
    assert app.backend.cron_states() == {} and app.backend.list_jobs(limit=10).jobs == []
